"""The lxml tree of a payload this process already holds, handed to the next step instead of a parse.

A message is built or parsed as a tree, serialized to bytes for the store, and
the next step (the first transmission, the delivery) gets the stored bytes
back and would parse them again.  In the same process the tree can travel with
them: :meth:`ParsedTrees.remember` files it under the bytes,
:meth:`ParsedTrees.take` hands it over once.

Keyed by content: bytes read back from a durable store (SQLite, PostgreSQL) are
a new object with the same content and find the tree as the very object an
in-memory store hands back does.  Hashing and comparing the bytes costs a small
fraction of a parse.  Equal bytes parse to equal trees, so which of two equal
messages' trees a taker gets does not matter.  The tree must be exactly what
the bytes serialize, and nobody may touch it after ``remember``: ``take`` gives
it to one owner, who may change it.  Bounded: entries nobody takes (a
rolled-back enqueue, a duplicate, a delivery in another process) fall out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from lxml import etree

__all__ = ["ParsedTrees", "TREES"]


class ParsedTrees:
    def __init__(self, limit: int = 1024, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._limit = limit
        #: A tree takes several times its bytes in memory: bound what waits to be taken by size too.
        self._max_bytes = max_bytes
        self._bytes = 0
        self._trees: OrderedDict[bytes, etree._Element] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def remember(self, payload: bytes, root: etree._Element) -> None:
        """File ``root`` (which serializes to ``payload``, and is no longer the caller's) under ``payload``."""
        if type(payload) is not bytes or len(payload) > self._max_bytes:
            return
        with self._lock:
            if self._trees.pop(payload, None) is None:
                self._bytes += len(payload)
            self._trees[payload] = root
            while len(self._trees) > self._limit or self._bytes > self._max_bytes:
                self._bytes -= len(self._trees.popitem(last=False)[0])

    def take(self, payload: bytes) -> etree._Element | None:
        """The tree of bytes equal to ``payload`` if remembered (then forgotten here), else None."""
        if type(payload) is not bytes:
            return None
        with self._lock:
            root = self._trees.pop(payload, None)
            if root is not None:
                self._bytes -= len(payload)
                self.hits += 1
            return root


#: The process's trees (one engine or several).
TREES = ParsedTrees()
