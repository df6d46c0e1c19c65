"""The lxml tree of a payload this process already holds, handed to the next step instead of a parse.

A message is built or parsed as a tree, serialized to bytes for the store, and
the next step (the first transmission, the delivery) gets the stored bytes
back and would parse them again.  In the same process the tree can travel with
them: :meth:`ParsedTrees.remember` files it under the bytes,
:meth:`ParsedTrees.take` hands it over once.

Keyed by content: bytes read back from a durable store (SQLite, PostgreSQL) are
a new object with the same content and find the tree as the very object an
in-memory store hands back does.  Not by their hash, though: hashing every byte
cost 0.4 ms per MiB, for each new bytes object (the stored copy, the copy read
back), and a large message paid it twice or more.  The key is the length and a
sample of at most :data:`_SAMPLE` bytes spread over the payload; payloads that
share it (the same envelope but for a message id) wait side by side, and a
taker gets a tree only for bytes equal to those it was filed under (a memcmp,
a small fraction of a parse).  Equal bytes parse to equal trees, so which of two equal
messages' trees a taker gets does not matter.  The tree must be exactly what
the bytes serialize, and nobody may touch it after ``remember``: ``take`` gives
it to one owner, who may change it.  Bounded: entries nobody takes (a
rolled-back enqueue, a duplicate, a delivery in another process) fall out.
A tree may carry a note of what was read from it (the WS-A properties a front end
read from a request), handed over with it so that the taker need not read it again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from lxml import etree

__all__ = ["ParsedTrees", "TREES"]


#: Bytes sampled from a payload for its key (evenly spaced: a difference in the middle counts).
_SAMPLE = 256


def _key(payload: bytes) -> tuple[int, bytes]:
    return len(payload), payload[::max(1, len(payload) // _SAMPLE)]


class ParsedTrees:
    def __init__(self, limit: int = 1024, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._limit = limit
        #: A tree takes several times its bytes in memory: bound what waits to be taken by size too.
        self._max_bytes = max_bytes
        self._bytes = 0
        self._count = 0
        #: key -> [(payload, tree, note)], the oldest key first
        self._trees: OrderedDict[tuple[int, bytes], list[tuple[bytes, etree._Element, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def remember(self, payload: bytes, root: etree._Element, note: Any = None) -> None:
        """File ``root`` (which serializes to ``payload``, and is no longer the caller's) under
        ``payload``, with ``note`` (what was read from it) for :meth:`take_noted`."""
        if type(payload) is not bytes or len(payload) > self._max_bytes:
            return
        key = _key(payload)
        with self._lock:
            entries = self._trees.get(key)
            if entries is None:
                entries = self._trees[key] = []
            for i, (filed, _, _) in enumerate(entries):
                if filed == payload:  # equal bytes: the newer tree replaces the older
                    entries[i] = (payload, root, note)
                    return
            entries.append((payload, root, note))
            self._bytes += len(payload)
            self._count += 1
            while self._count > self._limit or self._bytes > self._max_bytes:
                oldest = next(iter(self._trees))
                dropped, _, _ = self._trees[oldest].pop(0)
                if not self._trees[oldest]:
                    del self._trees[oldest]
                self._bytes -= len(dropped)
                self._count -= 1

    def take(self, payload: bytes) -> etree._Element | None:
        """The tree of bytes equal to ``payload`` if remembered (then forgotten here), else None."""
        taken = self.take_noted(payload)
        return taken[0] if taken is not None else None

    def take_noted(self, payload: bytes) -> tuple[etree._Element, Any] | None:
        """:meth:`take`, with the note the tree was filed with."""
        if type(payload) is not bytes:
            return None
        key = _key(payload)
        with self._lock:
            entries = self._trees.get(key)
            if entries is None:
                return None
            for i, (filed, root, note) in enumerate(entries):
                if filed is payload or filed == payload:
                    del entries[i]
                    if not entries:
                        del self._trees[key]
                    self._bytes -= len(payload)
                    self._count -= 1
                    self.hits += 1
                    return root, note
            return None


#: The process's trees (one engine or several).
TREES = ParsedTrees()
