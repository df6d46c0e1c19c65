"""Concurrent calls for one key done together: the first caller leads, those arriving meanwhile form the next batch.

Receives of one sequence take the same row lock and each pays its own commit
(on PostgreSQL a WAL flush, held under that lock).  Four HTTP threads
receiving a sequence's messages at once therefore queue on the lock one
commit after another.  Done together in one store transaction they pay one
commit and read the sequence's row once.

No caller waits for a batch to fill: a caller who finds no batch of its key
running starts one with its own item at once.  Callers arriving while it
runs wait; when it ends, the first of them leads the next batch with all of
them.  So a lone caller pays nothing, and the busier the key, the larger the
batches (the same shape as the recovery log's group commit).

The batch function returns one outcome per item, an exception for an item it
refused; :data:`ALONE` asks the caller to do its item by itself (the batch
could not settle it, e.g. its transaction failed).

A batch may let the next one start before it ends (:meth:`Combiner.hand_on`, from inside the
batch function): once its work is done and only its commit is left, the callers waiting
meanwhile form the next batch, which does its work while this one commits.  Batches of one
key then overlap by their commits, never by their work.

A batch may also take, before it ends, callers that came while it ran and whose items it can
still settle (:meth:`Combiner.join_late`): they then need not wait for it to end and form a
batch of their own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

__all__ = ["ALONE", "Combiner"]

T = TypeVar("T")

#: An outcome meaning "not settled by the batch: do it alone".
ALONE: Any = object()


#: What a thread's ``_leading.key`` holds when it leads no batch of that combiner (or handed it on).
_NONE: Any = object()


class _Slot(Generic[T]):
    __slots__ = ("item", "ready", "lead", "outcome")

    def __init__(self, item: T) -> None:
        self.item = item
        self.ready = threading.Event()
        self.lead = False
        self.outcome: Any = ALONE


class Combiner(Generic[T]):
    """Runs ``batch(items) -> outcomes`` for concurrent :meth:`submit` calls of one key."""

    def __init__(self, batch: Callable[[list[T]], list[Any]], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, not {limit!r}")
        self._batch = batch
        self._limit = limit
        self._lock = threading.Lock()
        #: key -> callers waiting for the running batch of that key to end (present: one runs)
        self._waiting: dict[Hashable, deque[_Slot[T]]] = {}
        #: Batches run and items they settled or refused (not ALONE): their ratio is the mean batch size.
        self.batches = 0
        self.items = 0
        #: Batches that let the next one start before they ended (:meth:`hand_on`).
        self.handed_on = 0
        #: ``key``: the key of the batch this thread leads, while it runs and has not handed on
        self._leading = threading.local()

    def queued(self, key: Hashable) -> int:
        """Callers of ``key`` waiting for the running batch to end (they form the next one)."""
        with self._lock:
            return len(self._waiting.get(key, ()))

    def busy(self, key: Hashable) -> bool:
        """Does a batch of ``key`` run now?  Read without the lock: a hint, true or false a moment later."""
        return key in self._waiting

    def submit(self, key: Hashable, item: T) -> Any:
        """The outcome of ``item`` (raised if it is an exception); :data:`ALONE` if the batch left it."""
        slot = _Slot(item)
        with self._lock:
            queue = self._waiting.get(key)
            if queue is None:
                self._waiting[key] = deque()
                slot.lead = True
            else:
                queue.append(slot)
        if not slot.lead:
            slot.ready.wait()
        if slot.lead:  # the first caller, or handed the lead when the batch before ended
            self._lead(key, slot)
        outcome = slot.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def hand_on(self) -> bool:
        """From inside the batch function: the batch's work is done (only its commit is left),
        so the next batch of its key may start now, led by the first caller waiting (or by the
        next to come), instead of when this one returns.  True if handed on (once per batch)."""
        key = getattr(self._leading, "key", _NONE)
        if key is _NONE:  # not inside a batch of this thread, or handed on already
            return False
        self._leading.key = _NONE
        with self._lock:
            self._pass_lead(key)
            self.handed_on += 1
        return True

    def join_late(self, accept: Callable[[T], bool]) -> list[T]:
        """From inside the batch function, before :meth:`hand_on`: the items of callers of its key
        waiting now (they came while it ran) that ``accept`` takes, up to the batch's limit, taken
        out of the next batch into this one, in their order.  The batch function then returns an
        outcome for each of them too, after those of its own items, in that order."""
        key = getattr(self._leading, "key", _NONE)
        late: list[_Slot[T]] = self._leading.late if key is not _NONE else []
        room = self._limit - self._leading.size - len(late) if key is not _NONE else 0
        if room <= 0:
            return []
        taken: list[_Slot[T]] = []
        with self._lock:
            queue = self._waiting[key]
            kept: deque[_Slot[T]] = deque()
            while queue:
                slot = queue.popleft()
                if len(taken) < room and accept(slot.item):
                    taken.append(slot)
                else:
                    kept.append(slot)
            self._waiting[key] = kept
        late.extend(taken)
        return [s.item for s in taken]

    def _pass_lead(self, key: Hashable) -> None:
        """The next batch of ``key`` may start: its first waiting caller leads (caller holds the lock)."""
        queue = self._waiting[key]
        if queue:
            following = queue.popleft()
            following.lead = True
            following.ready.set()
        else:
            del self._waiting[key]

    def _lead(self, key: Hashable, first: _Slot[T]) -> None:
        batch = [first]
        with self._lock:
            queue = self._waiting[key]
            while queue and len(batch) < self._limit:
                batch.append(queue.popleft())
        self._leading.key = key
        self._leading.size = len(batch)
        late: list[_Slot[T]] = []
        self._leading.late = late  # (join_late)
        try:
            outcomes = self._batch([s.item for s in batch])
            if len(outcomes) != len(batch) + len(late):
                raise AssertionError(f"batch gave {len(outcomes)} outcomes for {len(batch) + len(late)} items")
            settled = 0
            for s, outcome in zip(batch + late, outcomes, strict=True):
                s.outcome = outcome
                settled += outcome is not ALONE
            with self._lock:  # batches handed on may end at the same time
                self.batches += 1
                self.items += settled
        finally:  # whatever happened, every caller is answered (ALONE at worst) and one leads next
            if getattr(self._leading, "key", _NONE) is not _NONE:  # not handed on before
                self._leading.key = _NONE
                with self._lock:
                    self._pass_lead(key)
            for s in batch[1:]:
                s.ready.set()
            for s in late:
                s.ready.set()
