"""Log records that say which sequence and message they are about.

Every engine log line about a sequence carries ``sequence_id`` (and
``message_number`` when there is one) both in the text and as record
attributes, so a handler or a JSON formatter can filter one conversation out
of a busy log.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["SequenceLog", "for_sequence"]


class SequenceLog(logging.LoggerAdapter):
    """A logger adapter adding ``[seq <id> #<n>]`` to messages and as ``extra`` fields."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        kwargs["extra"] = {**extra, **kwargs.get("extra", {})}
        sequence = extra.get("sequence_id") or extra.get("sequence_key") or "-"
        number = extra.get("message_number")
        prefix = f"[seq {sequence}" + (f" #{number}]" if number is not None else "]")
        return f"{prefix} {msg}", kwargs


def for_sequence(logger: logging.Logger, sequence_id: str | None = None, number: int | None = None,
                 key: str | None = None) -> SequenceLog:
    return SequenceLog(logger, {"sequence_id": sequence_id, "message_number": number, "sequence_key": key})
