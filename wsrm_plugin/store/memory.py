"""The in-memory store: fast, per-sequence locking, nothing survives the process.

This is seed 004's in-memory design (Mercury's ``InMemoryStorageManager``):
each sequence is guarded by its own lock, taken when a transaction first
touches the sequence and held until the transaction ends (two-phase locking),
in the order RMD, invoker buffer, RMS.  Changes are staged in the transaction
and applied to the shared tables at commit, all at once, so a rollback only
drops the stage and a reader never sees half a transaction.

One exception to the locking, as in the SQL stores: buffering a received
message (``invoker.put``) does not wait for the invoker buffer's lock, which a
delivery holds while the application runs.  Reception would otherwise queue
behind delivery (and every other receive of the sequence behind it, holding
the RMD lock).  The put's rows are *inserted if absent* when it commits, under
the store's mutex: a number delivered or buffered meanwhile is not buffered
again, and an existing delivery record is never overwritten.

As an XA resource it is a *volatile* participant: work is staged per xid,
``prepare`` keeps the stage and the locks, ``commit`` applies it.  Prepared
branches live in this process only: :meth:`MemoryXAResource.recover` lists
those of the running process (so a recovery manager in the same process can
finish them) and nothing after a restart, because nothing is left.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
import dataclasses
from typing import Any

from txmanager.xa import XA_OK, XA_RDONLY
from txmanager.xid import Xid

from . import api
from .backlog import MessageIndex, in_flight
from .branches import BranchResource
from .api.states import rms_life
from .api import (
    RANK_INVOKER, RANK_RMD, RANK_RMS, BufferedMessage, DuplicateSequenceError, InvalidAcknowledgementError,
    InvokerSequence, LockTimeoutError, ManagerOnFirstUse, NodeCondition, PoisonMessage,
    RmdSequence, RmsMessage, RmsSequence, StoreClosedError, UnknownMessageError, UnknownSequenceError, _now,
)

__all__ = ["MemoryStore", "MemoryTransaction", "MemoryXAResource"]

log = logging.getLogger(__name__)


_REPLACERS: dict[type, Any] = {}


def replace(record: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for the store's frozen records, at about half its cost.

    ``dataclasses.replace`` walks the fields and calls the frozen ``__init__``
    (an ``object.__setattr__`` per field) at every change, ~6 us, and a call
    changes records 8 times on the client and 6 on the service.  The records
    have no ``__post_init__`` and every field is an init field (a record that
    had would fall back to ``dataclasses.replace``): a copy made by one
    function per class, written out like dataclasses writes its own, sets each
    slot directly.  Unknown names raise TypeError as ``replace`` does.
    """
    copy = _REPLACERS.get(type(record))
    if copy is None:
        copy = _REPLACERS[type(record)] = _replacer(type(record))
    return copy(record, changes)


def _replacer(cls: type) -> Any:
    fields = dataclasses.fields(cls)
    if (hasattr(cls, "__post_init__") or not hasattr(cls, "__slots__")
            or any(not f.init for f in fields)):
        return lambda record, changes: dataclasses.replace(record, **changes)
    names = [f.name for f in fields]
    lines = ["def copy(record, changes, new=object.__new__, cls=cls, known=known, "
             + ", ".join(f"set_{n}=cls.{n}.__set__" for n in names) + "):",
             "    if not known.issuperset(changes):",
             "        raise TypeError(f'{cls.__name__} has no fields {sorted(set(changes) - known)}')",
             "    made = new(cls)"]
    lines += [f"    set_{n}(made, changes['{n}'] if '{n}' in changes else record.{n})" for n in names]
    lines.append("    return made")
    namespace: dict[str, Any] = {"cls": cls, "known": frozenset(names)}
    exec("\n".join(lines), namespace)  # noqa: S102 -- names from the dataclass's own fields
    return namespace["copy"]


_DELETED = object()
_ALL = object()  # every group of a table, for _overlay

# Table names; the key of each row is given with it.
_RMS = "rms"          # key -> RmsSequence
_MSG = "rms_message"  # (sequence key, number) -> RmsMessage
_RMD = "rmd"          # sequence id -> RmdSequence
_INV = "invoker"      # sequence id -> InvokerSequence (delivered ranges; buffered not kept)
_BUF = "buffer"       # (sequence id, number) -> BufferedMessage
_POI = "poison"       # (sequence id, number) -> PoisonMessage
_CON = "condition"    # (kind, subject, reporter) -> NodeCondition
#: Tables keyed by (sequence, number), also kept grouped by sequence: an acknowledgement, a
#: delivery or a discard touches one sequence's rows, and copying the whole table for it made a
#: backlog of N messages cost O(N) per acknowledgement (15 ms each at 10,000 queued).
_GROUPED = (_MSG, _BUF, _POI)


class _Waiting:
    """The transactions waiting for one lock: a condition on the store's mutex, and how many."""

    __slots__ = ("cond", "count")

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.count = 0


class MemoryStore(api.StorageManager):
    """A volatile store in this process's memory (``open_store("memory:")``)."""

    commits_are_costly = False  # a commit applies a dict: batching receives only adds hand-offs

    def __init__(self, *, name: str = "memory", lock_timeout: float = 30.0) -> None:
        self.url = f"memory:{name}" if name != "memory" else "memory:"
        self.name = name
        self.lock_timeout = lock_timeout
        #: The mutex of the tables and locks, taken bare by the readers (a C-level ``with``:
        #: a Condition's own ``__enter__`` is Python, and a delivery reads dozens of rows).
        self._mutex = threading.Lock()
        self._tables: dict[str, dict[Any, Any]] = {t: {} for t in (_RMS, _MSG, _RMD, _INV, _BUF, _POI, _CON)}
        self._groups: dict[str, dict[Any, dict[Any, Any]]] = {t: {} for t in _GROUPED}
        #: the committed source messages indexed for due batches and acknowledgements (a backlog)
        self._messages = MessageIndex(self._tables[_MSG])
        #: The committed RMS rows' keys by the peer's identifier of their sequence: an
        #: acknowledgement names its sequence so, and finding it copied the whole RMS table (every
        #: open sequence, idle ones too) per acknowledgement (see ``_Rms.get_by_sequence_id``).
        self._rms_by_id: dict[str, str] = {}
        self._owners: dict[tuple[int, Any], MemoryTransaction] = {}
        #: The transactions waiting for each lock (see _acquire): a commit wakes those of its locks.
        self._waiting: dict[tuple[int, Any], _Waiting] = {}
        self._resource = MemoryXAResource(self)
        self._closed = False

    def begin(self, *, xa: Any = None, durable: bool = True) -> "MemoryTransaction":
        if self._closed:
            raise StoreClosedError(f"{self.url} is closed")
        if xa is not None:
            bound = self._resource.bind_current(xa)
            if bound is not None:
                return bound
            log.debug("begin(xa=...): no current transaction, using a local store transaction")
        return MemoryTransaction(self)

    def xa_resource(self) -> "MemoryXAResource":
        return self._resource

    def buffer_may_hold(self) -> bool:
        """Is any sequence's buffer holding a committed message that no transaction holds the
        buffer of?  A look without the mutex at the buffer's groups and their locks: a commit
        that buffers one wakes the invoker after it, so a look that raced it is followed by
        another.  A sequence whose buffer another transaction holds is skipped, as
        ``claim_next`` skips it (SKIP LOCKED): at 16 sequences most looks after a delivery
        found only messages being delivered by other invoker threads (still in the buffer
        until their commit), and opened a transaction to find nothing; the holder looks again
        after its commit (a delivering thread steps again at once)."""
        owners = self._owners
        for sequence_id in tuple(self._groups[_BUF]):  # a copy made at once: commits change the dict
            if (RANK_INVOKER, sequence_id) not in owners:
                return True
        return False

    def close(self) -> None:
        self._closed = True

    # -- locks (seed 004: one lock per sequence, held to the end) -------------

    def _acquire(self, tx: "MemoryTransaction", lock: tuple[int, Any], wait: bool) -> bool:
        deadline = None
        with self._mutex:
            while True:
                owner = self._owners.get(lock)
                if owner is None or owner is tx:
                    self._owners[lock] = tx
                    return True
                if not wait:
                    return False
                if deadline is None:
                    deadline = time.monotonic() + self.lock_timeout
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise LockTimeoutError(
                        f"waited {self.lock_timeout:.1f}s for {lock[1]!r}, held by another "
                        "transaction (a prepared XA branch or a long transaction); retry later "
                        "or raise lock_timeout")
                waiting = self._waiting.get(lock)
                if waiting is None:
                    waiting = self._waiting[lock] = _Waiting(threading.Condition(self._mutex))
                waiting.count += 1
                try:
                    waiting.cond.wait(remaining)
                finally:
                    waiting.count -= 1
                    if not waiting.count and self._waiting.get(lock) is waiting:
                        del self._waiting[lock]

    def _finish(self, tx: "MemoryTransaction", apply: bool) -> None:
        with self._mutex:
            if apply:
                inserts = tx._if_absent
                for (table, key), value in tx._changes.items():
                    if value is _DELETED:
                        self._remove_row(table, key)
                    elif inserts and (table, key) in inserts:
                        self._insert_if_absent(table, key, value)
                    else:
                        self._set_row(table, key, value)
            # its own locks only, and only their waiters woken: with many sequences at once, a
            # commit used to wake every transaction waiting for any lock, each to look and sleep again
            owners, waiters = self._owners, self._waiting
            for lock in tx._held:
                if owners.get(lock) is tx:
                    del owners[lock]
                    waiting = waiters.get(lock)
                    if waiting is not None:
                        waiting.cond.notify_all()

    def _insert_if_absent(self, table: str, key: Any, value: Any) -> None:
        """A put's row at commit (caller holds the mutex): never over a row committed meanwhile,
        and a message only when its number is not delivered (a duplicate that raced the delivery)."""
        rows = self._tables[table]
        if key in rows:
            return
        if table == _BUF:
            inv = self._tables[_INV].get(key[0])
            if inv is not None and key[1] in inv.delivered:
                return
        self._set_row(table, key, value)

    def _set_row(self, table: str, key: Any, value: Any) -> None:
        rows = self._tables[table]
        old = rows.get(key)
        rows[key] = value
        if table == _MSG:
            self._messages.changed(key, old, value)  # the row set first: a rebuild reads it
        elif table == _RMS:
            self._index_sequence_id(key, old, value)
        groups = self._groups.get(table)
        if groups is not None:
            groups.setdefault(key[0], {})[key] = value

    def _remove_row(self, table: str, key: Any) -> None:
        old = self._tables[table].pop(key, _DELETED)
        if old is _DELETED:
            return
        if table == _MSG:
            self._messages.changed(key, old, None)
        elif table == _RMS:
            self._index_sequence_id(key, old, None)
        groups = self._groups.get(table)
        if groups is not None:
            group = groups.get(key[0])
            if group is not None:
                group.pop(key, None)
                if not group:
                    del groups[key[0]]

    def _index_sequence_id(self, key: str, old: RmsSequence | None, new: RmsSequence | None) -> None:
        """Keep :attr:`_rms_by_id` in step with RMS row ``key`` (caller holds the mutex)."""
        if old is not None and old.sequence_id is not None and self._rms_by_id.get(old.sequence_id) == key:
            del self._rms_by_id[old.sequence_id]
        if new is not None and new.sequence_id is not None:
            self._rms_by_id[new.sequence_id] = key

    def _rms_key_of(self, sequence_id: str) -> str | None:
        with self._mutex:
            return self._rms_by_id.get(sequence_id)

    def _snapshot(self, table: str) -> dict[Any, Any]:
        with self._mutex:
            return dict(self._tables[table])

    def _snapshot_group(self, table: str, group: Any) -> dict[Any, Any]:
        with self._mutex:
            return dict(self._groups[table].get(group, ()))

    def _groups_of(self, table: str) -> list[Any]:
        """The sequences with committed rows in grouped ``table``."""
        with self._mutex:
            return list(self._groups[table])

    def _committed(self, table: str, key: Any) -> Any:
        with self._mutex:
            return self._tables[table].get(key)

    def _indexed(self, query: str, *args: Any) -> Any:
        """``MessageIndex.<query>(*args)`` on the committed messages, under the mutex."""
        with self._mutex:
            return getattr(self._messages, query)(*args)


class MemoryTransaction(api.StoreTransaction):
    """A transaction of the :class:`MemoryStore`: a stage of changes plus the locks it holds."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__()
        self._store = store
        self._changes: dict[tuple[str, Any], Any] = {}
        #: Staged rows applied only if absent at commit (see the module docstring): a put's.
        self._if_absent: set[tuple[str, Any]] = set()
        self._global: Any = None  # the global transaction when bound to XA
        #: numbers of the rms_message rows this transaction changed, by sequence (for the
        #: indexed queries, which read the committed rows from the store's index)
        self._staged_messages: dict[str, set[int]] = {}
        # the managers (rms, rms_messages, rmd, invoker, conditions) are made at first use
        # (ManagerOnFirstUse, set below the managers' classes): a transaction uses one or two

    # -- plumbing for the managers --------------------------------------------

    def _lock(self, rank: int, key: Any, *, wait: bool = True) -> bool:
        # the checks and the bookkeeping of StoreTransaction inline (_check_open, _check_lock_order,
        # _note_lock): a message's receipt and delivery take half a dozen locks between them
        if self._closed or self.failed is not None:
            self._check_open()  # (raises)
        lock = (rank, key)
        if lock in self._held:
            return True
        if rank < self._max_rank:
            self._check_lock_order(rank, key)  # (raises: against the order)
        try:
            if not self._store._acquire(self, lock, wait):
                return False
        except LockTimeoutError as exc:
            self._doom(exc)
            raise
        self._held.add(lock)
        if rank > self._max_rank:
            self._max_rank = rank
        return True

    def _order_only(self, rank: int, key: Any) -> None:
        """Lock-order bookkeeping for a row written without its lock (a put): no lock of a lower
        rank may follow, but the lock itself is not held, so a later ``_lock`` still takes it."""
        self._check_open()
        self._check_lock_order(rank, key)
        self._max_rank = max(self._max_rank, rank)

    def _read(self, table: str, key: Any) -> Any:
        # the open check and the committed row's look inline: a message's receipt and delivery
        # read a dozen rows between them, each two calls fewer
        if self._closed or self.failed is not None:
            self._check_open()  # (raises)
        value = self._changes.get((table, key))
        if value is None:
            store = self._store
            with store._mutex:
                return store._tables[table].get(key)
        if self._if_absent and (table, key) in self._if_absent:  # a row committed meanwhile wins
            return self._store._committed(table, key) or value
        return None if value is _DELETED else value

    def _write(self, table: str, key: Any, value: Any) -> None:
        self._changes[(table, key)] = value
        if table == _MSG:
            self._staged_messages.setdefault(key[0], set()).add(key[1])
        if self._if_absent:
            self._if_absent.discard((table, key))

    def _insert(self, table: str, key: Any, value: Any) -> None:
        """Stage a row applied at commit only if no other transaction committed one meanwhile."""
        self._changes[(table, key)] = value
        self._if_absent.add((table, key))

    def _delete(self, table: str, key: Any) -> None:
        self._changes[(table, key)] = _DELETED
        if table == _MSG:
            self._staged_messages.setdefault(key[0], set()).add(key[1])
        if self._if_absent:
            self._if_absent.discard((table, key))

    def _scan(self, table: str) -> dict[Any, Any]:
        """Committed rows overlaid with this transaction's own changes."""
        self._check_open()
        return self._overlay(self._store._snapshot(table), table)

    def _scan_group(self, table: str, group: Any) -> dict[Any, Any]:
        """:meth:`_scan` of the rows whose key starts with ``group`` (a sequence), without
        copying the rest of the table."""
        self._check_open()
        return self._overlay(self._store._snapshot_group(table, group), table, group)

    def _overlay(self, rows: dict[Any, Any], table: str, group: Any = _ALL) -> dict[Any, Any]:
        """``rows`` (committed) with this transaction's changes to ``table`` applied (only those
        of ``group``, when one is given)."""
        for (t, key), value in self._changes.items():
            if t != table or (group is not _ALL and key[0] != group):
                continue
            if value is _DELETED:
                rows.pop(key, None)
            elif key not in rows or (t, key) not in self._if_absent:
                rows[key] = value
        return rows

    @property
    def has_changes(self) -> bool:
        return bool(self._changes)

    supports_savepoints = True

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        self._check_open()
        before = dict(self._changes)
        inserts = set(self._if_absent)
        staged = {k: set(v) for k, v in self._staged_messages.items()}
        try:
            yield
        except BaseException:
            if not self._closed and self.failed is None:
                self._changes = before
                self._if_absent = inserts
                self._staged_messages = staged
            raise

    # -- ending -----------------------------------------------------------------

    def commit(self) -> None:
        api.refuse_if_global(self)
        self._refuse_commit_if_failed()
        self._check_open()
        self._end(apply=True)

    def rollback(self) -> None:
        if self._closed:
            return
        api.refuse_if_global(self)
        self._end(apply=False)

    def _end(self, apply: bool) -> None:
        self._closed = True
        self._store._finish(self, apply)
        self._changes = {}
        self._if_absent = set()
        self._staged_messages = {}
        self._drop_managers()

    def _own_messages(self, sequence_key: str) -> list[RmsMessage]:
        """This transaction's own rms_message rows of a sequence, as it staged them (deleted
        ones left out): what the indexed queries add to the committed rows."""
        numbers = self._staged_messages.get(sequence_key)
        if not numbers:
            return []
        rows = (self._changes.get((_MSG, (sequence_key, n))) for n in numbers)
        return [m for m in rows if m is not None and m is not _DELETED]

    def _current(self, msg: RmsMessage) -> RmsMessage | None:
        """``msg`` (a committed row) as this transaction sees it."""
        if msg.number in self._staged_messages.get(msg.sequence_key, ()):
            return self._read(_MSG, (msg.sequence_key, msg.number))
        return msg

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._global is not None:
            api.exit_global(self, exc_type)
            return
        super().__exit__(exc_type, exc, tb)


# --------------------------------------------------------------------------
# Managers
# --------------------------------------------------------------------------

class _Rms(api.RmsSequenceManager):
    _tx: MemoryTransaction

    def create(self, key: str, *, target: str, acks_to: str, rm_version: str,
               wsa_version: str, offered_id: str | None = None, expires: float | None = None,
               next_control_at: float | None = None, now: float | None = None) -> RmsSequence:
        tx = self._tx
        api.check_key(key, "sequence key")
        tx._lock(RANK_RMS, key)
        if tx._read(_RMS, key) is not None:
            raise DuplicateSequenceError(f"an RMS sequence with key {key!r} already exists")
        t = _now(now)
        seq = RmsSequence(key=key, target=target, acks_to=acks_to, rm_version=rm_version,
                          wsa_version=wsa_version, offered_id=offered_id, expires=expires,
                          next_control_at=t if next_control_at is None else next_control_at,
                          created_at=t, last_activity=t)
        tx._write(_RMS, key, seq)
        return seq

    def get(self, key: str, *, beside_enqueues: bool = False) -> RmsSequence | None:
        self._tx._lock(RANK_RMS, key)
        return self._tx._read(_RMS, key)

    def peek(self, key: str) -> RmsSequence | None:
        return self._tx._read(_RMS, key)

    def get_by_sequence_id(self, sequence_id: str, *, beside_enqueues: bool = False) -> RmsSequence | None:
        """The row this transaction staged with ``sequence_id``, else the committed one the
        store's index names (no copy of the table): locked, then read again, since it may have
        changed meanwhile."""
        tx = self._tx
        tx._check_open()
        keys = [key for (table, key), seq in tx._changes.items()
                if table == _RMS and seq is not _DELETED and seq.sequence_id == sequence_id]
        committed = tx._store._rms_key_of(sequence_id)
        if committed is not None and committed not in keys:
            keys.append(committed)
        for key in keys:
            found = self.get(key)
            if found is not None and found.sequence_id == sequence_id:
                return found
        return None

    def update(self, key: str, **changes: Any) -> RmsSequence:
        RmsSequence.check_changes(changes)
        seq = self.require(key)
        sid = changes.get("sequence_id")
        if sid is not None and sid != seq.sequence_id:
            for other in self._tx._scan(_RMS).values():
                if other.sequence_id == sid and other.key != key:
                    raise DuplicateSequenceError(
                        f"sequence id {sid!r} already belongs to RMS sequence {other.key!r}")
        new = replace(seq, **changes)
        self._tx._write(_RMS, key, new)
        return new

    def mark_last(self, key: str) -> RmsSequence:
        seq = self.require(key)
        new = replace(seq, last_message=True, last_number=seq.highest_number)
        self._tx._write(_RMS, key, new)
        return new

    def delete(self, key: str) -> None:
        self.require(key)
        tx = self._tx
        for mkey in list(tx._scan_group(_MSG, key)):
            tx._delete(_MSG, mkey)
        tx._delete(_RMS, key)

    def needing_work(self, now: float | None = None, limit: int = 100) -> list[RmsSequence]:
        t = _now(now)
        due = [s for s in self._tx._scan(_RMS).values()
               if (s.next_control_at is not None and s.next_control_at <= t)
               or (s.expires is not None and s.expires <= t)]
        due.sort(key=lambda s: (s.next_control_at if s.next_control_at is not None else s.expires,
                                s.key))
        return due[:limit]

    def list_all(self) -> list[RmsSequence]:
        return sorted(self._tx._scan(_RMS).values(), key=lambda s: (s.created_at, s.key))


class _RmsMessages(api.RmsMessageManager):
    _tx: MemoryTransaction

    def _seq(self, key: str) -> RmsSequence:
        self._tx._lock(RANK_RMS, key)
        seq = self._tx._read(_RMS, key)
        if seq is None:
            raise UnknownSequenceError("RMS", key)
        return seq

    def enqueue(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                message_id: str, last: bool = False, reply_callback: str | None = None,
                reply_context: bytes | None = None, send_at: float | None = None,
                now: float | None = None, awaits_reply: bool = False,
                handed_out: bool = False) -> RmsMessage:
        seq = self._seq(sequence_key)
        number = api.check_enqueue(seq, payload)
        t = _now(now)
        msg = RmsMessage(
            sequence_key=sequence_key, number=number, message_id=message_id, action=action,
            soap_version=soap_version, payload=bytes(payload), last=last,
            reply_callback=reply_callback, reply_context=reply_context,
            reply_pending=reply_callback is not None or awaits_reply,
            next_send_at=t if send_at is None else send_at, created_at=t,
            send_count=1 if handed_out else 0, last_sent_at=t if handed_out else None)
        self._tx._write(_MSG, (sequence_key, number), msg)
        changes: dict[str, Any] = {"next_number": number + 1}
        if last:
            changes.update(last_message=True, last_number=number)
        self._tx._write(_RMS, sequence_key, replace(seq, **changes))
        return msg

    def enqueue_claiming(self, sequence_key: str, payload: bytes, *, action: str, soap_version: str,
                         message_id: str, target: str, next_send_at: float, rmd_sequence_id: str | None = None,
                         reply_callback: str | None = None, reply_context: bytes | None = None,
                         send_at: float | None = None, awaits_reply: bool = False, now: float | None = None,
                         acked: Sequence[tuple[int, int]] | None = None
                         ) -> tuple[RmsMessage, bool, RmsSequence, RmdSequence | None] | None:
        """:meth:`enqueue`, and the message claimed as :meth:`claim_first_send` claims it when it
        is its caller's to send (its sequence transmitting to ``target``, the message before it
        acknowledged or purged, or among ``acked``: what the peer acknowledged and no
        transaction applied yet), in one step; destination sequence ``rmd_sequence_id`` read
        beside without its lock, as PostgreSQL's statement reads it (a lock taken after the
        source sequence's would go against the order of locks).

        The general answer (None: the caller enqueues, then claims in a step of its own) cost
        the caller's thread about a hundred Python calls more a request: the claim's own look
        at the sequence and its checks, done again."""
        t = _now(now)
        msg = self.enqueue(sequence_key, payload, action=action, soap_version=soap_version,
                           message_id=message_id, reply_callback=reply_callback, reply_context=reply_context,
                           send_at=send_at, now=t, awaits_reply=awaits_reply)
        tx = self._tx
        key = (sequence_key, msg.number)
        seq = tx._read(_RMS, sequence_key)
        before = tx._read(_MSG, (sequence_key, msg.number - 1)) if msg.number > 1 else None
        mine = seq.target == target and seq.sequence_id is not None and rms_life(seq).transmitting \
            and (before is None or before.acked
                 or (acked is not None and any(lo <= before.number <= hi for lo, hi in acked)))
        if mine:
            tx._write(_MSG, key, replace(msg, send_count=1, last_sent_at=t, next_send_at=next_send_at))
        rmd = tx._read(_RMD, rmd_sequence_id) if rmd_sequence_id is not None else None
        return msg, mine, seq, rmd

    def get(self, sequence_key: str, number: int) -> RmsMessage | None:
        self._seq(sequence_key)
        return self._tx._read(_MSG, (sequence_key, number))

    def find_by_message_id(self, message_id: str) -> RmsMessage | None:
        tx = self._tx
        tx._check_open()
        for key, numbers in tx._staged_messages.items():  # this transaction's own first
            for n in numbers:
                msg = tx._read(_MSG, (key, n))
                if msg is not None and msg.message_id == message_id:
                    return msg
        msg = tx._store._indexed("by_message_id", message_id)
        return tx._current(msg) if msg is not None else None

    def mark_acked(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                   now: float | None = None) -> list[int]:
        seq = self._seq(sequence_key)
        acked = api.AckRanges.from_ranges(ranges)
        return self._mark_named(seq, acked, self._unacked_named(sequence_key, acked), now)

    def _unacked_named(self, sequence_key: str, ranges: api.AckRanges) -> list[RmsMessage]:
        """The unacknowledged messages ``ranges`` name, ascending, as this transaction sees them:
        from the index of the committed ones, not a walk of the sequence's rows (a peer's
        ranges are cumulative, and a backlog's unsent messages are many).  Read once per
        acknowledgement: its check and its writes both use them."""
        return self._unacked_named_counted(sequence_key, ranges)[0]

    def _unacked_named_counted(self, sequence_key: str, ranges: api.AckRanges) -> tuple[list[RmsMessage], int | None]:
        """:meth:`_unacked_named`, and the sequence's unacknowledged messages counted in the same
        look when this transaction changed none of its messages (None otherwise)."""
        tx = self._tx
        committed, count = tx._store._indexed("unacked_in", sequence_key, ranges.ranges)
        if sequence_key not in tx._staged_messages:
            return committed, count  # as committed: ascending, unacknowledged
        own = tx._own_messages(sequence_key)
        found: dict[int, RmsMessage] = {m.number: m for m in committed}
        for lo, hi in ranges.ranges:
            found.update((m.number, m) for m in own if lo <= m.number <= hi)
        current = (tx._current(m) for _, m in sorted(found.items()))
        return [m for m in current if m is not None and not m.acked], None

    def _mark_named(self, seq: RmsSequence, acked: api.AckRanges, named: list[RmsMessage],
                    now: float | None) -> list[int]:
        """:meth:`mark_acked` of ``seq`` (locked) once ``named`` (:meth:`_unacked_named` of
        ``acked``) was read: checked whole first, then written."""
        api.check_ack(seq, acked, lambda lo, hi: [m.number for m in named
                                                  if lo <= m.number <= hi and m.send_count == 0])
        tx, key = self._tx, seq.key
        newly = []
        for msg in named:
            tx._write(_MSG, (key, msg.number), replace(msg, acked=True))
            newly.append(msg.number)
        tx._write(_RMS, key, replace(seq, last_activity=_now(now)))
        return newly

    def acknowledge(self, sequence_key: str, ranges: Iterable[tuple[int, int]],
                    now: float | None = None, *, keep_awaiting: bool = False) -> tuple[list[int], bool]:
        """The general method's steps (mark, look for one unacknowledged, purge) in one pass:
        the sequence and the messages its ranges name read once (the requests that wait for
        their replies, ``keep_awaiting``, are among them), checked whole, then each written once:
        deleted when it waits for no reply (what the purge did next, after marking it), marked
        acknowledged when it does; the sequence's row written once.  An acknowledgement rides on
        every request and every reply: marking each message, then reading it back to delete it,
        and writing the sequence twice, cost 216 Python calls an acknowledgement of two
        messages in a transaction of its own (now 148)."""
        merged = api.AckRanges.from_ranges(ranges)
        if not merged.ranges:
            return [], self.has_unacked(sequence_key)
        seq = self._seq(sequence_key)
        named, unacked = self._unacked_named_counted(sequence_key, merged)
        if keep_awaiting and merged.ranges[-1][1] <= seq.highest_number:
            awaiting = [m.number for m in named if m.reply_pending]
            if awaiting:
                merged = merged.difference(api.AckRanges.of(awaiting))
                named = [m for m in named if not m.reply_pending]
        if not merged.ranges:
            return [], self.has_unacked(sequence_key)
        api.check_ack(seq, merged, lambda lo, hi: [m.number for m in named
                                                   if lo <= m.number <= hi and m.send_count == 0])
        tx = self._tx
        extra = 0
        for msg in named:
            if msg.reply_pending:
                tx._write(_MSG, (sequence_key, msg.number), replace(msg, acked=True))
            else:
                tx._delete(_MSG, (sequence_key, msg.number))
                extra += max(msg.send_count - 1, 0)  # its retransmissions
        if named:  # and those acknowledged before whose reply came since, as the purge did
            extra += self._purge_rows(sequence_key)[1]
        t = _now(now)
        tx._write(_RMS, sequence_key, replace(seq, last_activity=t) if not extra else replace(
            seq, last_activity=t, purged_retransmissions=seq.purged_retransmissions + extra))
        # unacked counted before any change of the sequence's messages: less those named
        pending = unacked > len(named) if unacked is not None else self.has_unacked(sequence_key)
        return [m.number for m in named], pending

    def mark_answered_acknowledging(self, message_id: str, sequence_id: str, ranges: Iterable[tuple[int, int]],
                                    now: float | None = None, *, keep_offered_awaiting: bool = False
                                    ) -> tuple[tuple[str, int, bool] | None,
                                               tuple[RmsSequence, list[int], bool] | None]:
        """The general method without looking the sequence up again by the peer's identifier:
        the request's sequence, locked by the mark, is the one the acknowledgement must name."""
        answered = self.mark_answered(message_id)
        if answered is None:
            return None, None
        key, number, acked = answered
        merged = api.AckRanges.from_ranges(ranges)
        seq = self._tx._read(_RMS, key)
        if (acked or seq is None or seq.sequence_id != sequence_id or number not in merged
                or not rms_life(seq).transmitting):
            return answered, None
        try:
            newly, pending = self.acknowledge(key, merged.ranges, now,
                                              keep_awaiting=keep_offered_awaiting and seq.offered_id is not None)
        except InvalidAcknowledgementError:
            return answered, None
        return answered, (seq, newly, pending)

    def due_messages(self, now: float | None = None, limit: int = 100, *,
                     per_sequence: int | None = None, payloads: bool = True) -> list[RmsMessage]:
        t = _now(now)
        tx = self._tx
        store = tx._store
        full = limit if per_sequence is None else min(per_sequence, limit)
        # The sequences that may have a message due: from the store's index (the committed rows)
        # and this transaction's own, so what a batch touches does not grow with the backlog.
        keys = [key for key, seq in tx._scan(_RMS).items()
                if seq.sequence_id is not None and not seq.faulted
                and (tx._own_messages(key) or store._indexed("may_be_due", key, t))]
        take = full
        if per_sequence is not None and len(keys) > 1:
            # Round robin: each sequence's first messages, then the seconds...  The batch takes
            # about its share of each (16 sequences: 4 of a batch of 50), so each is first asked
            # for twice that, not for a whole batch (800 candidates read and sorted for 50 taken);
            # only when that leaves the batch short while a sequence had more are they asked again.
            take = min(full, max(4, 2 * -(-limit // len(keys))))
        while True:
            out, short = self._due_round(t, keys, limit, take, round_robin=per_sequence is not None)
            if len(out) >= limit or not short or take >= full:
                return out
            take = full

    def _due_round(self, t: float, keys: list[str], limit: int, take: int, *,
                   round_robin: bool) -> tuple[list[RmsMessage], bool]:
        """:meth:`due_messages` from each sequence's first ``take`` due messages; and whether a
        sequence had that many (it may have more)."""
        tx = self._tx
        store = tx._store
        by_sequence: dict[str, list[RmsMessage]] = {}
        short = False
        for key in keys:
            own = tx._own_messages(key)
            due = store._indexed("first_due", key, t, take + len(own))
            if own:
                found = {m.number: m for m in due}
                found.update((m.number, m) for m in own)
                current = (tx._current(m) for m in found.values())
                due = heapq.nsmallest(take, (m for m in current if m is not None and not m.acked
                                             and m.next_send_at <= t), key=lambda m: (m.next_send_at, m.number))
            if due:
                by_sequence[key] = due
                short = short or len(due) >= take
        if not round_robin:  # oldest first, across sequences
            ordered = sorted((m for msgs in by_sequence.values() for m in msgs),
                             key=lambda m: (m.next_send_at, m.sequence_key, m.number))
        elif len(by_sequence) == 1:
            ordered = next(iter(by_sequence.values()))
        else:  # round robin: every sequence's first due message, then the seconds...
            ranked = [(rank, m) for msgs in by_sequence.values() for rank, m in enumerate(msgs, 1)]
            ordered = [m for _, m in sorted(ranked, key=lambda r: (r[0], r[1].next_send_at, r[1].sequence_key,
                                                                    r[1].number))]
        # Take them in that order, locking each sequence the first time one of its messages is
        # taken (skipped when another transaction holds it), its candidates read again then:
        # they were read before the lock.
        out: list[RmsMessage] = []
        held: dict[str, dict[int, RmsMessage | None]] = {}
        skipped: set[str] = set()
        for msg in ordered:
            if len(out) >= limit:
                break
            key = msg.sequence_key
            if key in skipped:
                continue
            rows = held.get(key)
            if rows is None:
                if not tx._lock(RANK_RMS, key, wait=False):
                    skipped.add(key)  # SKIP LOCKED
                    continue
                rows = held[key] = {m.number: tx._current(m) for m in store._indexed("current", by_sequence[key])}
            row = rows.get(msg.number)
            if row is not None and not row.acked and row.next_send_at <= t:
                out.append(row)
        return out, short

    def claim_first_sends(self, sequence_key: str, limit: int, *, next_send_at: float,
                          now: float | None = None, after: int = 0) -> list[RmsMessage]:
        """From the index's first due messages of the sequence (and this transaction's own), not
        from all of them: what it reads does not grow with the backlog."""
        t = _now(now)
        tx = self._tx
        self._seq(sequence_key)  # locked first: the committed rows read next stay as they are
        own = tx._own_messages(sequence_key)
        found = {m.number: m for m in tx._store._indexed("first_due", sequence_key, t, 2 * limit + len(own))}
        found.update((m.number, m) for m in own)
        current = (tx._current(m) for m in found.values())
        msgs = heapq.nsmallest(max(0, limit), (m for m in current if m is not None and not m.acked
                                               and m.next_send_at <= t and m.number > after),
                               key=lambda m: m.number)
        if not msgs or any(m.send_count for m in msgs):
            return []
        for msg in msgs:
            self.record_send_attempt(sequence_key, msg.number, next_send_at=next_send_at, now=now)
        return msgs

    def record_send_attempt(self, sequence_key: str, number: int, *, next_send_at: float,
                            now: float | None = None) -> RmsMessage:
        msg = self._require(sequence_key, number)
        new = replace(msg, send_count=msg.send_count + 1, last_sent_at=_now(now),
                      next_send_at=next_send_at)
        self._tx._write(_MSG, (sequence_key, number), new)
        return new

    def make_due(self, sequence_key: str, numbers: Iterable[int], at: float | None = None) -> int:
        self._seq(sequence_key)
        t = _now(at)
        changed = 0
        for n in set(numbers):
            msg = self._tx._read(_MSG, (sequence_key, n))
            if msg is not None and not msg.acked:
                self._tx._write(_MSG, (sequence_key, n), replace(msg, next_send_at=t))
                changed += 1
        return changed

    def reply_received(self, sequence_key: str, number: int) -> RmsMessage:
        msg = self._require(sequence_key, number)
        new = replace(msg, reply_pending=False)
        self._tx._write(_MSG, (sequence_key, number), new)
        return new

    def count_unacked(self, sequence_key: str | None = None) -> int:
        tx = self._tx
        tx._check_open()
        count = tx._store._indexed("unacked_count", sequence_key)
        keys = [sequence_key] if sequence_key is not None else list(tx._staged_messages)
        for key in keys:  # this transaction's own changes, against the committed rows
            for n in tx._staged_messages.get(key, ()):
                committed = tx._store._committed(_MSG, (key, n))
                mine = tx._changes[(_MSG, (key, n))]
                count += (mine is not _DELETED and not mine.acked) - (committed is not None and not committed.acked)
        return count

    def count_in_flight(self, sequence_key: str, window: int, now: float | None = None) -> int:
        tx = self._tx
        tx._check_open()
        count = tx._store._indexed("in_flight", sequence_key)  # kept by the index: no walk
        for n in tx._staged_messages.get(sequence_key, ()):  # this transaction's own changes
            committed = tx._store._committed(_MSG, (sequence_key, n))
            mine = tx._changes[(_MSG, (sequence_key, n))]
            count += in_flight(None if mine is _DELETED else mine) - in_flight(committed)
        return count

    def purge_acked(self, sequence_key: str | None = None) -> int:
        tx = self._tx
        tx._check_open()
        keys = set(tx._store._indexed("acked", sequence_key))
        keys.update(key for key in ([sequence_key] if sequence_key is not None else list(tx._staged_messages))
                    if tx._own_messages(key))
        purged = 0
        for key in sorted(keys):
            if sequence_key is None and not tx._lock(RANK_RMS, key, wait=False):
                continue  # busy: purge it next time
            seq = self._seq(key)
            count, extra = self._purge_rows(key)
            if extra:
                tx._write(_RMS, key, replace(seq, purged_retransmissions=seq.purged_retransmissions + extra))
            purged += count
        return purged

    def _purge_rows(self, key: str) -> tuple[int, int]:
        """Delete the acknowledged messages of sequence ``key`` (locked) that wait for no reply,
        as this transaction sees them (the committed ones from the index, and its own); returns
        how many, and their retransmissions (sends beyond the first), for the sequence's count."""
        tx = self._tx
        numbers = {m.number for msgs in tx._store._indexed("acked", key).values() for m in msgs}
        numbers.update(m.number for m in tx._own_messages(key))
        count = extra = 0
        for n in sorted(numbers):
            m = tx._read(_MSG, (key, n))
            if m is not None and m.acked and not m.reply_pending:
                tx._delete(_MSG, (key, n))
                count += 1
                extra += max(m.send_count - 1, 0)
        return count, extra

    def list_for(self, sequence_key: str) -> list[RmsMessage]:
        return [m for _, m in sorted(self._tx._scan_group(_MSG, sequence_key).items())]

    def _require(self, sequence_key: str, number: int) -> RmsMessage:
        msg = self.get(sequence_key, number)
        if msg is None:
            raise UnknownMessageError(
                f"no message {number} of RMS sequence {sequence_key!r} in the store")
        return msg


class _Rmd(api.RmdSequenceManager):
    _tx: MemoryTransaction

    def create(self, sequence_id: str, *, acks_to: str, rm_version: str, wsa_version: str,
               principal: str | None = None, offered_id: str | None = None,
               expires: float | None = None, now: float | None = None) -> RmdSequence:
        api.check_key(sequence_id, "sequence id")
        self._tx._lock(RANK_RMD, sequence_id)
        if self._tx._read(_RMD, sequence_id) is not None:
            raise DuplicateSequenceError(f"an RMD sequence {sequence_id!r} already exists")
        t = _now(now)
        seq = RmdSequence(sequence_id=sequence_id, acks_to=acks_to, rm_version=rm_version,
                          wsa_version=wsa_version, principal=principal, offered_id=offered_id,
                          expires=expires, created_at=t, last_activity=t)
        self._tx._write(_RMD, sequence_id, seq)
        return seq

    def get(self, sequence_id: str) -> RmdSequence | None:
        self._tx._lock(RANK_RMD, sequence_id)
        return self._tx._read(_RMD, sequence_id)

    def record_received(self, sequence_id: str, number: int, *, last: bool = False,
                        now: float | None = None) -> bool:
        api.check_number(number)
        seq = self.require(sequence_id)
        received = seq.received.add(number)
        new = received is not seq.received
        changes: dict[str, Any] = {"received": received, "last_activity": _now(now)}
        if last:
            changes["last_number"] = number
        self._tx._write(_RMD, sequence_id, replace(seq, **changes))
        return new

    def update(self, sequence_id: str, **changes: Any) -> RmdSequence:
        RmdSequence.check_changes(changes)
        new = replace(self.require(sequence_id), **changes)
        self._tx._write(_RMD, sequence_id, new)
        return new

    def request_ack(self, sequence_id: str, due_at: float | None = None) -> RmdSequence:
        seq = self.require(sequence_id)
        due = _now(due_at)
        if seq.ack_due_at is not None and seq.ack_due_at <= due:
            return seq
        return self.update(sequence_id, ack_due_at=due)

    def ack_sent(self, sequence_id: str) -> RmdSequence:
        return self.update(sequence_id, ack_due_at=None)

    def needing_ack(self, now: float | None = None, limit: int = 100) -> list[RmdSequence]:
        t = _now(now)
        due = [s for s in self._tx._scan(_RMD).values()
               if s.ack_due_at is not None and s.ack_due_at <= t]
        return sorted(due, key=lambda s: (s.ack_due_at, s.sequence_id))[:limit]

    def list_all(self) -> list[RmdSequence]:
        return sorted(self._tx._scan(_RMD).values(), key=lambda s: (s.created_at, s.sequence_id))

    def open_ids(self, principal: str | None = None) -> list[str]:
        return [sid for sid, s in self._tx._scan(_RMD).items()
                if not s.terminated and (principal is None or s.principal == principal)]

    def delete(self, sequence_id: str) -> None:
        self.require(sequence_id)
        self._tx._delete(_RMD, sequence_id)


class _Invoker(api.InvokerBufferManager):
    _tx: MemoryTransaction

    def _inv(self, sequence_id: str) -> InvokerSequence:
        return self._tx._read(_INV, sequence_id) or InvokerSequence(sequence_id=sequence_id)

    def put(self, sequence_id: str, number: int, payload: bytes, *, action: str,
            soap_version: str, message_id: str | None = None, reply_to: str | None = None,
            now: float | None = None) -> bool:
        """Buffer a message without waiting for the sequence's buffer lock (see the module docstring).

        A delivery holds that lock while the application runs; reads here see
        what is committed, and the rows are inserted only if still absent at
        commit, so a delivery committing meanwhile is never undone.
        """
        api.check_number(number)
        tx = self._tx
        tx._order_only(RANK_INVOKER, sequence_id)
        row = tx._read(_INV, sequence_id)
        inv = row or InvokerSequence(sequence_id=sequence_id)
        if number in inv.delivered or tx._read(_BUF, (sequence_id, number)):
            return False
        tx._insert(_BUF, (sequence_id, number), BufferedMessage(
            sequence_id=sequence_id, number=number, message_id=message_id, action=action,
            soap_version=soap_version, payload=bytes(payload), reply_to=reply_to,
            received_at=_now(now)))
        if row is None:
            tx._insert(_INV, sequence_id, inv)
        return True

    def held(self, sequence_id: str, received: api.AckRanges) -> int:
        """Received minus delivered, from the delivery record: no scan of the buffer per receive."""
        inv = self._tx._read(_INV, sequence_id)
        return received.difference(inv.delivered).count if inv is not None else received.count

    def _due_in_order(self, sequence_id: str, now: float | None) -> BufferedMessage | None:
        """The sequence's next message in order, if buffered (and due at ``now``): a lookup, not a scan."""
        msg = self._tx._read(_BUF, (sequence_id, self._inv(sequence_id).next_in_order))
        if msg is None or (now is not None and msg.next_attempt_at is not None and msg.next_attempt_at > now):
            return None
        return msg

    def _next(self, sequence_id: str, in_order: bool,
              buffered: dict[Any, BufferedMessage]) -> BufferedMessage | None:
        numbers = sorted(n for (s, n) in buffered if s == sequence_id)
        if not numbers:
            return None
        if in_order:
            want = self._inv(sequence_id).next_in_order
            return buffered.get((sequence_id, want))
        return buffered[(sequence_id, numbers[0])]

    def next_deliverable(self, sequence_id: str, *, in_order: bool = True,
                         now: float | None = None) -> BufferedMessage | None:
        self._tx._lock(RANK_INVOKER, sequence_id)
        if in_order:
            return self._due_in_order(sequence_id, now)
        buffered = self._tx._scan_group(_BUF, sequence_id)
        return self._next(sequence_id, in_order, buffered if now is None else _due(buffered, now))

    def claim_next(self, *, in_order: bool = True, now: float | None = None) -> BufferedMessage | None:
        tx = self._tx
        now = _now(now)
        if in_order:  # the sequences with buffered messages, each its next number looked up: no scan
            store = tx._store
            changes = tx._changes
            candidates: Any = store._groups_of(_BUF)
            if changes:  # (an invoker's claim opens its transaction: nothing staged yet)
                candidates = {key[0] for (table, key), value in changes.items()
                              if table == _BUF and value is not _DELETED}.union(candidates)
            owners = store._owners
            committed_inv, committed_buf = store._tables[_INV], store._tables[_BUF]
            for sequence_id in sorted(candidates):
                owner = owners.get((RANK_INVOKER, sequence_id))  # a peek: the lock below decides
                if owner is not None and owner is not tx:
                    continue  # SKIP LOCKED, before its rows are read: another invoker delivers it
                if changes:
                    if self._due_in_order(sequence_id, now) is None:
                        continue
                else:  # a peek at the committed rows without the mutex (as the owner's): read again below
                    inv = committed_inv.get(sequence_id)
                    peeked = committed_buf.get((sequence_id, inv.delivered.next_expected if inv is not None else 1))
                    if peeked is None or (peeked.next_attempt_at is not None and peeked.next_attempt_at > now):
                        continue
                if not tx._lock(RANK_INVOKER, sequence_id, wait=False):
                    continue  # SKIP LOCKED: another invoker delivers this sequence
                found = self._due_in_order(sequence_id, now)
                if found is not None:
                    return found
            return None
        for sequence_id in sorted({s for (s, _) in _due(tx._scan(_BUF), now)}):
            if not tx._lock(RANK_INVOKER, sequence_id, wait=False):
                continue  # SKIP LOCKED: another invoker delivers this sequence
            found = self._next(sequence_id, in_order, _due(tx._scan_group(_BUF, sequence_id), now))
            if found is not None:
                return found
        return None

    def mark_delivered(self, sequence_id: str, number: int) -> None:
        tx = self._tx
        tx._lock(RANK_INVOKER, sequence_id)
        if tx._read(_BUF, (sequence_id, number)) is None:
            raise UnknownMessageError(
                f"message {number} of sequence {sequence_id!r} is not in the invoker buffer")
        tx._delete(_BUF, (sequence_id, number))
        inv = self._inv(sequence_id)
        tx._write(_INV, sequence_id, replace(
            inv, delivered=inv.delivered.add(number)))

    def take_next(self, sequence_id: str, number: int) -> bool:
        """Waits for a delivery of the sequence in progress elsewhere (it holds the buffer)."""
        api.check_number(number)
        tx = self._tx
        tx._lock(RANK_INVOKER, sequence_id)
        inv = self._inv(sequence_id)
        if inv.delivered.highest != number - 1 or inv.next_in_order != number \
                or tx._read(_BUF, (sequence_id, number)) is not None:
            return False
        tx._write(_INV, sequence_id, replace(inv, delivered=inv.delivered.add(number)))
        return True

    def state(self, sequence_id: str) -> InvokerSequence:
        inv = self._tx._scan(_INV).get(sequence_id) or InvokerSequence(sequence_id=sequence_id)
        return replace(inv, buffered=self.count(sequence_id))

    def count(self, sequence_id: str | None = None) -> int:
        rows = self._tx._scan(_BUF) if sequence_id is None else self._tx._scan_group(_BUF, sequence_id)
        return len(rows)

    def held_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (sequence_id, _), msg in self._tx._scan(_BUF).items():
            out[sequence_id] = out.get(sequence_id, 0) + len(msg.payload)
        return out

    def discard(self, sequence_id: str) -> int:
        tx = self._tx
        tx._lock(RANK_INVOKER, sequence_id)
        keys = list(tx._scan_group(_BUF, sequence_id))
        for k in keys:
            tx._delete(_BUF, k)
        tx._delete(_INV, sequence_id)
        return len(keys)

    # -- failed deliveries and the poison store -------------------------------------------------

    def get(self, sequence_id: str, number: int) -> BufferedMessage | None:
        self._tx._lock(RANK_INVOKER, sequence_id)
        return self._tx._read(_BUF, (sequence_id, number))

    def record_failure(self, sequence_id: str, number: int, *, attempts: int, cycle: int,
                       next_attempt_at: float | None, error: str) -> BufferedMessage:
        msg = replace(self._require(sequence_id, number), attempts=attempts, cycle=cycle,
                      next_attempt_at=next_attempt_at, last_error=error)
        self._tx._write(_BUF, (sequence_id, number), msg)
        return msg

    def poison(self, sequence_id: str, number: int, *, hold: bool, error: str | None = None,
               now: float | None = None) -> PoisonMessage:
        tx = self._tx
        msg = self._require(sequence_id, number)
        poisoned = api.poison_of(msg, hold=hold, error=error, now=_now(now))
        tx._delete(_BUF, (sequence_id, number))
        tx._write(_POI, (sequence_id, number), poisoned)
        if not hold:
            inv = self._inv(sequence_id)
            tx._write(_INV, sequence_id, replace(inv, delivered=inv.delivered.add(number)))
        return poisoned

    def list_poison(self, sequence_id: str | None = None) -> list[PoisonMessage]:
        rows = list((self._tx._scan(_POI) if sequence_id is None
                     else self._tx._scan_group(_POI, sequence_id)).values())
        return sorted(rows, key=lambda p: (p.poisoned_at, p.sequence_id, p.number))

    def get_poison(self, sequence_id: str, number: int) -> PoisonMessage | None:
        return self._tx._read(_POI, (sequence_id, number))

    def _require_poison(self, sequence_id: str, number: int) -> PoisonMessage:
        self._tx._lock(RANK_INVOKER, sequence_id)
        poisoned = self._tx._read(_POI, (sequence_id, number))
        if poisoned is None:
            raise UnknownMessageError(f"no poison message {number} of sequence {sequence_id!r}")
        return poisoned

    def retry_poison(self, sequence_id: str, number: int, *, now: float | None = None) -> BufferedMessage:
        tx = self._tx
        poisoned = self._require_poison(sequence_id, number)
        inv = tx._read(_INV, sequence_id)
        delivered = api.delivered_for_retry(inv.delivered if inv else None, number)
        msg = api.buffered_of(poisoned)
        tx._delete(_POI, (sequence_id, number))
        tx._write(_BUF, (sequence_id, number), msg)
        tx._write(_INV, sequence_id, replace(inv or InvokerSequence(sequence_id=sequence_id),
                                             delivered=delivered))
        return msg

    def discard_poison(self, sequence_id: str, number: int) -> PoisonMessage:
        tx = self._tx
        poisoned = self._require_poison(sequence_id, number)
        tx._delete(_POI, (sequence_id, number))
        inv = tx._read(_INV, sequence_id)
        if inv is not None and number not in inv.delivered:
            tx._write(_INV, sequence_id, replace(inv, delivered=inv.delivered.add(number)))
        return poisoned

    def count_poison(self, sequence_id: str | None = None) -> int:
        return len(self._tx._scan(_POI) if sequence_id is None else self._tx._scan_group(_POI, sequence_id))

    def count_retrying(self, sequence_id: str | None = None) -> int:
        rows = self._tx._scan(_BUF) if sequence_id is None else self._tx._scan_group(_BUF, sequence_id)
        return sum(1 for m in rows.values() if m.waiting_for_retry)


def _due(buffered: dict[Any, BufferedMessage], now: float) -> dict[Any, BufferedMessage]:
    """The buffered messages not waiting for a later retry."""
    return {k: m for k, m in buffered.items() if m.next_attempt_at is None or m.next_attempt_at <= now}


# --------------------------------------------------------------------------
# XA
# --------------------------------------------------------------------------

class _Conditions(api.ConditionManager):
    _tx: MemoryTransaction

    def put(self, condition: NodeCondition) -> None:
        self._tx._write(_CON, (condition.kind, condition.subject, condition.reporter), condition)

    def remove(self, kind: str, *, subject: str | None = None, reporter: str | None = None,
               reported_before: float | None = None) -> int:
        gone = [key for key, c in self._tx._scan(_CON).items()
                if c.kind == kind and (subject is None or c.subject == subject)
                and (reporter is None or c.reporter == reporter)
                and (reported_before is None or c.reported_at < reported_before)]
        for key in gone:
            self._tx._delete(_CON, key)
        return len(gone)

    def list_all(self, kind: str | None = None) -> list[NodeCondition]:
        found = [c for c in self._tx._scan(_CON).values() if kind is None or c.kind == kind]
        return sorted(found, key=lambda c: (c.since, c.kind, c.subject, c.reporter))


# A transaction's managers, made on first use (see ManagerOnFirstUse)
MemoryTransaction.rms = ManagerOnFirstUse("rms", _Rms)  # type: ignore[assignment]
MemoryTransaction.rms_messages = ManagerOnFirstUse("rms_messages", _RmsMessages)  # type: ignore[assignment]
MemoryTransaction.rmd = ManagerOnFirstUse("rmd", _Rmd)  # type: ignore[assignment]
MemoryTransaction.invoker = ManagerOnFirstUse("invoker", _Invoker)  # type: ignore[assignment]
MemoryTransaction.conditions = ManagerOnFirstUse("conditions", _Conditions)  # type: ignore[assignment]

class MemoryXAResource(BranchResource):
    """The memory store as a volatile XA participant (see the module docstring).

    A prepared branch keeps its stage and its locks until phase 2.
    :meth:`recover` lists the branches prepared in this process: a recovery
    manager in the same process can still finish them; after a restart there
    is nothing left to recover.
    """

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self._prepared: dict[Xid, MemoryTransaction] = {}

    def _open_branch_tx(self, xid: Xid) -> MemoryTransaction:
        assert isinstance(self._store, MemoryStore)
        return MemoryTransaction(self._store)

    def _store_finish(self, tx: Any, commit: bool) -> None:
        tx._end(apply=commit)

    def prepare(self, xid: Xid) -> int:
        if xid in self._prepared:
            raise self._protocol_error(xid, "is already prepared")
        branch = self._get(xid)
        self._refuse_failed(branch)
        if not branch.tx.has_changes:
            self._abort(branch)
            return XA_RDONLY
        with self._lock:
            self._branches.pop(xid, None)
            self._prepared[xid] = branch.tx  # stage and locks stay until phase 2
        return XA_OK

    def commit(self, xid: Xid, one_phase: bool = False) -> None:
        with self._lock:
            prepared = self._prepared.pop(xid, None) if not one_phase else None
        if prepared is not None:
            prepared._end(apply=True)
            return
        if xid in self._prepared:
            raise self._protocol_error(xid, "is prepared: commit it in two phases")
        branch = self._get(xid)
        if not one_phase:
            raise self._protocol_error(xid, "is not prepared: prepare it or commit one-phase")
        self._refuse_failed(branch)
        self._pop(xid)
        branch.tx._end(apply=True)

    def rollback(self, xid: Xid) -> None:
        with self._lock:
            prepared = self._prepared.pop(xid, None)
        if prepared is not None:
            prepared._end(apply=False)
            return
        self._abort(self._get(xid))

    def recover(self, flags: int = 0) -> list[Xid]:
        with self._lock:
            return list(self._prepared)
