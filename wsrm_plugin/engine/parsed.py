"""The lxml tree of a payload this process already holds, handed to the next step instead of a parse.

A message is built or parsed as a tree, serialized to bytes for the store, and
the next step (the first transmission, the delivery) gets the stored bytes
back and would parse them again.  With an in-memory store those bytes are the
very same object, so the tree can travel with them: :meth:`ParsedTrees.remember`
files it under the bytes object, :meth:`ParsedTrees.take` hands it over once.

Keyed by identity, not content: an entry holds its bytes object, so the id
cannot be reused while the entry lives, and ``take`` checks ``is``.  Bytes read
back from a durable store are new objects and simply miss (they are parsed).
The tree must be exactly what the bytes serialize, and nobody may touch it
after ``remember``: ``take`` gives it to one owner, who may change it.
Bounded: entries nobody takes (a rolled-back enqueue, a duplicate) fall out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from lxml import etree

__all__ = ["ParsedTrees", "TREES"]


class ParsedTrees:
    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        self._trees: OrderedDict[int, tuple[bytes, etree._Element]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def remember(self, payload: bytes, root: etree._Element) -> None:
        """File ``root`` (which serializes to ``payload``, and is no longer the caller's) under ``payload``."""
        if type(payload) is not bytes:
            return
        with self._lock:
            self._trees[id(payload)] = (payload, root)
            while len(self._trees) > self._limit:
                self._trees.popitem(last=False)

    def take(self, payload: bytes) -> etree._Element | None:
        """The tree of ``payload`` if this very object was remembered (then forgotten here), else None."""
        with self._lock:
            entry = self._trees.pop(id(payload), None)
            if entry is None:
                return None
            if entry[0] is not payload:  # cannot happen while the entry holds it; belt and braces
                return None
            self.hits += 1
            return entry[1]


#: The process's trees (one engine or several: ids of live objects do not collide).
TREES = ParsedTrees()
