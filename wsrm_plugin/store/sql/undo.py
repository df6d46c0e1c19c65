"""Undo records for the SQLite store's XA branches: the before-image of every row a branch
wrote, as JSON (bytes base64-encoded), so a prepared branch can be rolled back after a
crash by writing them back.  Readable by an operator, and no pickle.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from .. import api
from .rows import PRIMARY_KEYS

UndoLog = dict[tuple[str, tuple[Any, ...]], "dict[str, Any] | None"]


def _enc(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    return value


def _dec(value: Any) -> Any:
    if isinstance(value, dict):
        return base64.b64decode(value["$b"])
    return value


def encode_undo(undo: UndoLog) -> bytes:
    """Before-images as JSON (bytes base64-encoded): readable by an operator, no pickle."""
    items = [[table, [_enc(k) for k in pk], None if image is None
              else {c: _enc(v) for c, v in image.items()}]
             for (table, pk), image in undo.items()]
    return json.dumps(items, separators=(",", ":")).encode("utf-8")


def decode_undo(data: bytes) -> UndoLog:
    out: UndoLog = {}
    for table, pk, image in json.loads(bytes(data).decode("utf-8")):
        if table not in PRIMARY_KEYS:
            raise api.StoreError(f"corrupt undo record: unknown table {table!r}")
        out[(table, tuple(_dec(k) for k in pk))] = (
            None if image is None else {c: _dec(v) for c, v in image.items()})
    return out
