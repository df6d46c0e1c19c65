"""Large payloads as bytes: PostgreSQL's binary COPY instead of bytea in a statement's text.

psycopg2 puts a bytea parameter into the statement's text in hex, and the server's lexer spent
about half of PostgreSQL's CPU of a 1 MiB enqueue walking it; a SELECT brings a payload back in
hex too, twice its size.  So the outgoing messages (``rms_message``) and the delivery buffer
(``invoker_message``) read and write payloads of :data:`COPY_PAYLOAD_AT` bytes or more with
``COPY ... (FORMAT binary)`` where the dialect can (``Dialect.copy_binary``): their SELECTs leave
such a payload out (:func:`cols_leaving_large_payloads`) and one COPY fills them in
(:func:`with_large_payloads`).  Both tables go through these two functions, so the threshold and
the read are the same for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, TypeVar

from .transaction import SqlTransaction

#: Payloads of at least this many bytes are written with COPY (``Dialect.copy_binary``): its extra
#: round trip costs less than the server's lexer over the payload's hex from here on
COPY_PAYLOAD_AT = 32 * 1024


class _HasPayload(Protocol):
    @property
    def payload(self) -> bytes | None: ...


_M = TypeVar("_M", bound=_HasPayload)


def cols_leaving_large_payloads(cols: tuple[str, ...], alias: str = "") -> str:
    """The column list ``cols`` with ``payload`` read as NULL when it has :data:`COPY_PAYLOAD_AT`
    bytes or more: ``octet_length`` reads only a stored value's header, not the value."""
    m = f"{alias}." if alias else ""
    return ", ".join(f"CASE WHEN octet_length({m}payload) < {COPY_PAYLOAD_AT} THEN {m}payload END"
                     if c == "payload" else m + c for c in cols)


def with_large_payloads(tx: SqlTransaction, msgs: list[_M], table: str, keys: str,
                        key: Callable[[_M], tuple[str, int]]) -> list[_M]:
    """``msgs`` with the payloads :func:`cols_leaving_large_payloads` left out read, by one COPY
    of ``table``'s rows whose two key columns (``keys``: "a, b") match ``key`` of a message."""
    missing = [key(m) for m in msgs if m.payload is None]
    if not missing:
        return msgs
    found = tx.copy_out_payloads(table, keys, missing)
    return [m if m.payload is not None else replace(m, payload=found[key(m)])  # type: ignore[type-var]
            for m in msgs]
