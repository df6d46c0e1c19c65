"""The recovery log: the transaction manager's durable memory of its decisions.

Two-phase commit with *presumed abort* needs only one durable fact per
transaction: "these prepared branches are to be committed".  It is written
(and fsynced) after every branch voted yes and before the first phase-2 call;
a transaction with no such record is presumed rolled back.  A "done" record
follows once every branch answered, and heuristic outcomes are kept until an
operator forgets them.  After a crash the recovery manager replays the log to
learn which in-doubt branches to commit.

File format (version 2): an 11-byte header ``WSRX-TMLOG2``, then records,
each framed as::

    marker b"\xf7TxR" | length (uint32 BE) | crc32(length bytes + payload) (uint32 BE) | payload

then, while the log is open, zero bytes up to the end of the file.  The
payload is a JSON object in ASCII; the marker's first byte is not ASCII, so a
marker is never inside an intact payload.  That is what lets a reader find
the next record after a damaged one: after a bad frame it scans for the next
marker and checks that frame's checksum.  Every intact record is read, however
many damaged ones precede it (format 1, ``WSRX-TMLOG1``, had no marker and
stopped at the first bad record, cutting away everything after it; it is still
read, resynchronising on the opening of a record's JSON, and rewritten in
format 2 when opened).

Why the zero bytes: the space for records is allocated ahead, in chunks
(``posix_fallocate``), so that an append does not change the file's size and
the ``fdatasync`` of a commit decision has no new file size to commit.
Measured on this project's ext4 disk: a third off each sync (median about
140 -> 95 microseconds), the largest single cost of a two-phase commit.  So
a region of zeros after the last record is the clean end of the log (the
unused allocation of a log that was not closed), not damage; ``close`` gives
the unused space back.  A record never ends in a zero byte (its payload is a
JSON object), so "the rest of the file is zeros" is exact.

Damage (anything between the header and the clean end that is not an intact
record: a flipped byte, a torn or truncated record, a hole) never stops the
start and never costs an intact record.  It does switch the log to SAFE MODE,
as Narayana's object store marks an unreadable record rather than guessing:
the missing bytes may have held a commit decision, so presumed abort would be
a guess that can break atomicity.  In safe mode recovery commits what the
intact records decided, presumes nothing about the rest of this node's
prepared branches, and reports them in doubt for ``wsrm recover``.  At start
the damaged file is copied to ``<path>.damaged-<time>`` and the log rewritten
(crash-safe, as a compaction) with its intact live records and a "damage"
record, so safe mode survives restarts and compactions until an operator
ends it (``wsrm recover --end-safe-mode``, :meth:`RecoveryLog.end_safe_mode`).
A torn last record counts as damage too, with one exception.  Linux copies
a write a page at a time and gives up between two pages when the writing
process is SIGKILLed: the last append of a killed process can stop at a page
boundary.  That write never returned, so it was never synced nor acknowledged,
and a torn last record that stops exactly at a page boundary, with nothing
readable after it, is dropped with a WARNING (:func:`_interrupted_append`).  Any
other torn record means an OS crash or a damaged disk, and there is no way to
tell one that was never acknowledged from the damaged remains of one that was.

Compaction writes ``<path>.compact-<pid>``, fsyncs it, renames it over the
log and fsyncs the directory: at every instant ``<path>`` is the old log or
the complete new one; a temporary file left by a crash is removed at start.

Concurrent decisions share one write and one ``fdatasync`` (group commit,
leader/follower: see :meth:`RecoveryLog._submit`).

Only one process may append to a log: an exclusive ``fcntl.flock`` on
``<path>.lock`` is held while it is open.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import LogLockedError, RecoveryLogError
from .xa import XA_HEURCOM, XA_HEURHAZ, XA_HEURMIX, XA_HEURRB
from .xid import Xid

__all__ = ["LogEntry", "TransactionLog", "RecoveryLog", "MemoryLog", "MAGIC", "MAGIC_V1", "MARK"]

log = logging.getLogger(__name__)

MAGIC = b"WSRX-TMLOG2"
#: The header of format 1 (no record marker), still read and upgraded on open.
MAGIC_V1 = b"WSRX-TMLOG1"
#: Starts every record of format 2 (not ASCII: never inside a payload).
MARK = b"\xf7TxR"
_FRAME = struct.Struct(">II")
_LEN = struct.Struct(">I")
#: A frame announcing more than this is corruption, not a record.
MAX_RECORD = 1 << 24
DEFAULT_COMPACT_THRESHOLD = 1 << 20
#: Room for records is allocated ahead in chunks of this many bytes.
DEFAULT_PREALLOCATE = 1 << 20
_HEURISTIC_CODES = frozenset((XA_HEURCOM, XA_HEURHAZ, XA_HEURMIX, XA_HEURRB))


@dataclass(frozen=True)
class LogEntry:
    """What the log still knows about one global transaction.

    ``committing`` is True while a commit decision has no "done" record: its
    ``branches`` (branch xid, resource name) must be committed by recovery.
    ``heuristics`` maps branch xids to the XA_HEUR* code a resource reported,
    kept until forgotten.  ``logged_at`` is the wall-clock time of the decision.
    """

    gxid: Xid
    branches: tuple[tuple[Xid, str], ...] = ()
    committing: bool = False
    heuristics: Mapping[Xid, int] = field(default_factory=dict)
    logged_at: float | None = None

    def resource_of(self, xid: Xid) -> str | None:
        """The name of the resource that holds branch ``xid``, if the log knows it."""
        for bxid, name in self.branches:
            if bxid == xid:
                return name
        return None


class TransactionLog(Protocol):
    """What the transaction and recovery managers need from a log."""

    durable: bool

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None: ...
    def log_done(self, gxid: Xid) -> None: ...
    def log_heuristic(self, gxid: Xid, xid: Xid, code: int,
                      resource_name: str | None = None) -> None: ...
    def forget(self, gxid: Xid) -> None: ...
    def pending(self) -> dict[Xid, LogEntry]: ...
    def is_pending(self, gxid: Xid) -> bool: ...
    def damaged(self) -> list[str]: ...
    def mark_sources(self) -> frozenset[str]: ...
    def log_mark_source(self, database: str) -> None: ...
    def close(self) -> None: ...


# -- the in-memory picture both logs keep ---------------------------------------


class _Ledger:
    """The live state built from records: one place that knows their meaning.

    The logs call :meth:`commit`, :meth:`heuristic`, :meth:`done` and
    :meth:`forget` with the xids they were given; :meth:`apply` parses a
    record read back from the file and calls the same methods.  (Applying
    the decoded record on the commit path, as before, parsed four gids per
    transaction that the caller had in hand.)
    """

    def __init__(self) -> None:
        self._entries: dict[Xid, dict[str, Any]] = {}
        #: Descriptions of unreadable parts of the log (non-empty: safe mode).
        self.damage: list[str] = []
        #: The node (transaction manager) that writes this log, once it said so.
        self.node: str | None = None
        #: Databases that may hold commit marks of this node (see :mod:`.marks`).
        self.mark_sources: frozenset[str] = frozenset()

    def mark_damaged(self, what: str) -> None:
        self.damage.append(what)

    def repaired(self) -> None:
        self.damage.clear()

    def commit(self, gxid: Xid, branches: Sequence[tuple[Xid, str]], at: float) -> None:
        entry = self._entries.get(gxid)
        if entry is None:
            entry = self._entries[gxid] = _new_entry()
        known = entry["branches"]
        for xid, name in branches:
            known[xid] = name
        entry["committing"] = True
        entry["at"] = at

    def heuristic(self, gxid: Xid, xid: Xid, code: int, resource_name: str | None) -> None:
        entry = self._entries.get(gxid)
        if entry is None:
            entry = self._entries[gxid] = _new_entry()
        entry["heuristics"][xid] = code
        if resource_name is not None:
            entry["branches"].setdefault(xid, resource_name)

    def done(self, gxid: Xid) -> None:
        entry = self._entries.get(gxid)
        if entry is not None:
            entry["committing"] = False
            if not entry["heuristics"]:
                del self._entries[gxid]

    def forget(self, gxid: Xid) -> None:
        entry = self._entries.get(gxid)
        if entry is not None:
            entry["heuristics"].clear()
            if not entry["committing"]:
                del self._entries[gxid]

    def apply(self, rec: Mapping[str, Any]) -> None:
        """Apply one decoded record; raises ValueError/KeyError/TypeError when it is malformed."""
        if not isinstance(rec, dict):
            raise TypeError(f"a record is a JSON object, not {type(rec).__name__}")
        if self._apply_global(rec):
            return
        kind = rec["t"]
        gxid = Xid.from_text(rec["g"])
        if kind == "commit":
            self.commit(gxid, [(Xid.from_text(x), str(name)) for x, name in rec["b"]],
                        float(rec["at"]))
        elif kind == "heur":
            code = int(rec["c"])
            if code not in _HEURISTIC_CODES:
                raise ValueError(f"heuristic record with non-heuristic code {code}")
            name = rec.get("r")
            self.heuristic(gxid, Xid.from_text(rec["x"]), code,
                           None if name is None else str(name))
        elif kind == "done":
            self.done(gxid)
        elif kind == "forget":
            self.forget(gxid)
        else:
            raise ValueError(f"unknown record type {kind!r}")

    def _apply_global(self, rec: Mapping[str, Any]) -> bool:
        """The records about the log itself; True when ``rec`` was one."""
        kind = rec.get("t")
        if kind == "damage":
            self.mark_damaged(str(rec["what"]))
        elif kind == "repaired":
            self.repaired()
        elif kind == "node":
            self.node = str(rec["n"])
        elif kind == "marks":
            self.mark_sources = self.mark_sources | {str(rec["db"])}
        else:
            return False
        return True

    def is_pending(self, gxid: Xid) -> bool:
        return gxid in self._entries

    def pending(self) -> dict[Xid, LogEntry]:
        return {
            g: LogEntry(g, tuple(e["branches"].items()), e["committing"],
                        dict(e["heuristics"]), e["at"])
            for g, e in self._entries.items()
        }

    def live_payloads(self) -> list[bytes]:
        """The fewest records that rebuild the current state (for compaction)."""
        out: list[bytes] = [] if self.node is None else [
            f'{{"t":"node","n":{_q(self.node)}}}'.encode()]
        out.extend(f'{{"t":"damage","what":{_q(what)}}}'.encode() for what in self.damage)
        out.extend(_mark_source_payload(db) for db in sorted(self.mark_sources))
        for g, e in self._entries.items():
            if e["committing"]:
                out.append(_commit_payload(g, e["branches"].items(), e["at"]))
            for xid, code in e["heuristics"].items():
                out.append(_heuristic_payload(g, xid, code, e["branches"].get(xid)))
        return out


def _new_entry() -> dict[str, Any]:
    return {"branches": {}, "committing": False, "heuristics": {}, "at": None}


# Records are JSON objects, written without json.dumps: the encoder's dict
# walk cost more than the fsync-free rest of logging a decision.  The output
# is exactly what ``json.dumps(record, separators=(",", ":"))`` writes: strings
# through the json module's own C string encoder, floats by repr (as json).
_q = json.encoder.encode_basestring_ascii


def _commit_payload(gxid: Xid, branches, at: float) -> bytes:
    listed = ",".join(f"[{_q(x.to_pg_gid())},{_q(str(name))}]" for x, name in branches)
    return (f'{{"t":"commit","g":{_q(gxid.to_pg_gid())},"b":[{listed}],'
            f'"at":{float(at)!r}}}').encode()


def _mark_source_payload(database: str) -> bytes:
    return f'{{"t":"marks","db":{_q(database)}}}'.encode()


def commit_record(gxid: Xid, branches: Sequence[tuple[Xid, str]], at: float) -> str:
    """The text of a commit decision, as a log record; also what a commit mark stores."""
    return _commit_payload(gxid, branches, at).decode("ascii")


def mark_record(gxid: Xid, branches: Sequence[tuple[Xid, str]], at: float) -> str:
    """A commit decision as a commit mark keeps it (:mod:`.marks`): :func:`commit_record`
    without what the mark's row says already (its ``gtrid`` column names the transaction),
    and each branch of that transaction by its qualifier alone (``+`` and its gid's last part).
    About half the size: its row is written, and deleted, once per marked commit."""
    gid = gxid.to_pg_gid()
    listed = ",".join(f"[{_q(_within(x.to_pg_gid(), gid))},{_q(str(name))}]" for x, name in branches)
    return f'{{"b":[{listed}],"at":{float(at)!r}}}'


def _within(branch_gid: str, gid: str) -> str:
    # a gid is "format_gtrid_bqual" in base64, which has no "_": a branch of the transaction
    # is exactly a gid that begins with the transaction's own ("format_gtrid_")
    return "+" + branch_gid[len(gid):] if branch_gid.startswith(gid) else branch_gid


def parse_mark_record(gtrid: str, text: str, node: str | None = None) -> LogEntry:
    """The decision in a mark's ``record`` (:func:`mark_record`; or the whole
    :func:`commit_record`, as marks written before kept it), its row's ``gtrid`` and ``node``
    (needed when the ``gtrid`` is the short key, :func:`.marks.key`);
    ValueError/KeyError/TypeError when malformed."""
    from . import marks  # marks' own module needs nothing of this one's

    rec = json.loads(text)
    if not isinstance(rec, dict):
        raise ValueError(f"not a commit mark: {text[:80]!r}")
    if "t" in rec:
        entry = parse_commit_record(text)
        if gtrid not in marks.keys(entry.gxid):
            raise ValueError(f"the mark of {gtrid} records the decision of {entry.gxid}")
        return entry
    if node is None and "_" not in gtrid:
        raise ValueError(f"the mark {gtrid!r} names its transaction with its node's: give the node")
    gxid = marks.gxid_of(gtrid, node or "")
    gid = gxid.to_pg_gid()
    branches = tuple((Xid.from_text(gid + x[1:] if x.startswith("+") else x), str(name))
                     for x, name in rec["b"])
    return LogEntry(gxid, branches, True, {}, float(rec["at"]))


def parse_commit_record(text: str) -> LogEntry:
    """The decision in :func:`commit_record`'s text; ValueError/KeyError/TypeError when malformed."""
    rec = json.loads(text)
    if not isinstance(rec, dict) or rec.get("t") != "commit":
        raise ValueError(f"not a commit record: {text[:80]!r}")
    branches = tuple((Xid.from_text(x), str(name)) for x, name in rec["b"])
    return LogEntry(Xid.from_text(rec["g"]), branches, True, {}, float(rec["at"]))


def _heuristic_payload(gxid: Xid, xid: Xid, code: int, resource_name: str | None) -> bytes:
    name = "null" if resource_name is None else _q(str(resource_name))
    return (f'{{"t":"heur","g":{_q(gxid.to_pg_gid())},"x":{_q(xid.to_pg_gid())},'
            f'"c":{int(code):d},"r":{name}}}').encode()


def _marker_payload(kind: str, gxid: Xid) -> bytes:
    """A "done" or "forget" record."""
    return f'{{"t":"{kind}","g":{_q(gxid.to_pg_gid())}}}'.encode()


def _check_heuristic(code: int) -> None:
    if code not in _HEURISTIC_CODES:
        raise ValueError(f"{code} is not an XA_HEUR* code")


def _check_global(gxid: Xid) -> None:
    if gxid.bqual:
        raise ValueError(f"{gxid} is a branch xid; the log is keyed by the global xid "
                         "(use xid.global_xid())")


class MemoryLog:
    """A log that forgets everything when the process ends.

    Used when the manager is created with ``log=None``: two-phase commit and
    in-process recovery (finishing branches left behind by a failing resource)
    still work, but after a crash every in-doubt branch is presumed aborted,
    even those whose commit had been decided.  Only for when that is acceptable.
    """

    durable = False

    def __init__(self) -> None:
        self._ledger = _Ledger()
        self._mutex = threading.Lock()

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None:
        _check_global(gxid)
        with self._mutex:
            self._ledger.commit(gxid, branches, time.time())

    def log_done(self, gxid: Xid) -> None:
        with self._mutex:
            self._ledger.done(gxid)

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int,
                      resource_name: str | None = None) -> None:
        _check_heuristic(code)
        with self._mutex:
            self._ledger.heuristic(gxid, xid, code, resource_name)

    def forget(self, gxid: Xid) -> None:
        with self._mutex:
            self._ledger.forget(gxid)

    def pending(self) -> dict[Xid, LogEntry]:
        with self._mutex:
            return self._ledger.pending()

    def is_pending(self, gxid: Xid) -> bool:
        with self._mutex:
            return self._ledger.is_pending(gxid)

    def damaged(self) -> list[str]:
        """Never damaged (and never durable)."""
        return []

    def mark_sources(self) -> frozenset[str]:
        return self._ledger.mark_sources

    def log_mark_source(self, database: str) -> None:
        with self._mutex:
            self._ledger.mark_sources = self._ledger.mark_sources | {database}

    def close(self) -> None:
        pass


# -- the durable log -------------------------------------------------------------


class _Pending:
    """One record waiting for the group writer (see :meth:`RecoveryLog._submit`)."""

    __slots__ = ("frame", "sync", "apply", "finished", "error")

    def __init__(self, frame: bytes, sync: bool, apply: Callable[[], None]) -> None:
        self.frame = frame
        self.sync = sync
        self.apply = apply
        self.finished = False
        self.error: OSError | None = None


class RecoveryLog:
    """An append-only, checksummed, fsynced file of transaction decisions.

    ``fsync=False`` skips the flushes (for tests on a machine that must not
    wait on a disk); a crash of the OS can then lose decisions.  The file is
    compacted (rewritten with only the live records) once it grows past
    ``compact_threshold`` bytes.  ``preallocate`` is the size of the chunks in
    which room for records is allocated ahead (see the module docstring for
    why); 0 appends by growing the file.  ``create=False`` refuses to create a
    log that is not there (an operator tool must not invent an empty log from
    a mistyped path).  Thread-safe (concurrent decisions share one fsync);
    one process at a time.

    ``fsyncs`` counts the flushes this object made (data and directory), so a
    benchmark or a test can see group commit at work.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str], fsync: bool = True, *,
                 compact_threshold: int = DEFAULT_COMPACT_THRESHOLD,
                 preallocate: int = DEFAULT_PREALLOCATE, create: bool = True) -> None:
        if preallocate < 0:
            raise ValueError("preallocate must be >= 0")
        self.path = os.fspath(path)
        self._fsync = fsync
        self._threshold = compact_threshold
        self._next_compact = compact_threshold
        self._chunk = preallocate
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._queue: list[_Pending] = []
        self._leading = False
        self._ledger = _Ledger()
        self._fd: int | None = None
        self._size = 0       # where the next record goes
        self._allocated = 0  # the file's size on disk: >= _size, zeros past _size
        self.fsyncs = 0
        self.format_version = 2
        _check_location(self.path, create)
        self._lock_fd = self._acquire_lock()
        try:
            self._clean_leftovers()
            self._fd = self._open_and_replay(create)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._next_compact = max(self._threshold, 2 * self._size)

    # -- public API ----------------------------------------------------------

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None:
        """Durably record "commit these branches"; returns only once it is on disk.

        Concurrent callers share one write and one fsync (group commit)."""
        _check_global(gxid)
        branches = tuple(branches)  # read twice: for the record and for the ledger
        at = time.time()
        payload = _commit_payload(gxid, branches, at)
        self._submit(payload, True, lambda: self._ledger.commit(gxid, branches, at))

    def log_done(self, gxid: Xid) -> None:
        """Every branch answered.  Not fsynced: if lost, recovery re-commits and
        hears XAER_NOTA, which it counts as done."""
        self._submit(_marker_payload("done", gxid), False, lambda: self._ledger.done(gxid))

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int,
                      resource_name: str | None = None) -> None:
        """Remember a heuristic outcome until :meth:`forget`; fsynced, an operator needs it."""
        _check_heuristic(code)
        payload = _heuristic_payload(gxid, xid, code, resource_name)
        self._submit(payload, True,
                     lambda: self._ledger.heuristic(gxid, xid, code, resource_name))

    def forget(self, gxid: Xid) -> None:
        """Drop the heuristic records of ``gxid`` (the operator has dealt with them)."""
        self._submit(_marker_payload("forget", gxid), False, lambda: self._ledger.forget(gxid))

    def mark_sources(self) -> frozenset[str]:
        """The databases that may hold commit marks of this node: recovery must read each
        before it presumes any branch of this node aborted (see :mod:`.marks`)."""
        return self._ledger.mark_sources

    def log_mark_source(self, database: str) -> None:
        """Durably note that ``database`` may hold this node's commit marks, before the first.

        Once per database for the life of the log (a set lookup afterwards): a
        commit decided by a mark is known only to that database, so a recovery
        that did not know to ask it would presume the transaction aborted."""
        if database in self._ledger.mark_sources:
            return
        def add() -> None:
            self._ledger.mark_sources = self._ledger.mark_sources | {database}
        self._submit(_mark_source_payload(database), True, add)

    def pending(self) -> dict[Xid, LogEntry]:
        """Decisions without "done", and heuristics not forgotten, by global xid."""
        with self._mutex:
            return self._ledger.pending()

    def is_pending(self, gxid: Xid) -> bool:
        with self._mutex:
            return self._ledger.is_pending(gxid)

    def damaged(self) -> list[str]:
        """What could not be read in this log, oldest first; empty when it is sound.

        While it is not empty, recovery is in SAFE MODE: an unreadable record
        may have been a commit decision, so no branch of this node is presumed
        aborted; an operator resolves them (``wsrm recover``) and then calls
        :meth:`end_safe_mode`.  Kept in the log itself, so a restart (or a
        compaction) does not forget it."""
        with self._mutex:
            return list(self._ledger.damage)

    def node(self) -> str | None:
        """The node whose log this is (None for a log that never said: format 1, or new)."""
        with self._mutex:
            return self._ledger.node

    def claim_node(self, node: str) -> None:
        """Name the node that writes this log (durably, once); a log that names
        another node is refused: its in-doubt branches carry the other name, so
        this manager's recovery would never presume them aborted, and the other
        name's manager would find no log."""
        with self._mutex:
            known = self._ledger.node
        if known == node:
            return
        if known is not None:
            raise RecoveryLogError(
                f"recovery log {self.path} belongs to node {known!r}, not {node!r}: each "
                "transaction manager keeps its own node name and log across restarts "
                "(fix node= or the log path)")
        self._submit(f'{{"t":"node","n":{_q(node)}}}'.encode(), True,
                     lambda: setattr(self._ledger, "node", node))

    def end_safe_mode(self) -> list[str]:
        """An operator's word that the damage has been dealt with; returns what it was."""
        with self._mutex:
            was = list(self._ledger.damage)
        if was:
            self._submit(f'{{"t":"repaired","at":{time.time()!r}}}'.encode(), True,
                         self._ledger.repaired)
            log.warning("recovery log %s: safe mode ended by the operator (damage was: %s)",
                        self.path, "; ".join(was))
        return was

    def size(self) -> int:
        """Bytes of records in the file (header included; the unused allocation is not counted)."""
        with self._mutex:
            return self._size

    def compact(self) -> None:
        """Rewrite the file with only the live records (atomically, by rename)."""
        with self._cond:
            while self._leading:
                self._cond.wait()
            self._compact_locked()

    def close(self) -> None:
        """Close the file, giving back the room allocated ahead for records."""
        with self._cond:
            while self._leading or self._queue:
                self._cond.wait()
            if self._fd is not None:
                if self._allocated > self._size:
                    try:
                        os.ftruncate(self._fd, self._size)
                    except OSError as e:  # harmless: the zeros read as the end of the log
                        log.info("recovery log %s: could not give back unused space: %s",
                                 self.path, e)
                os.close(self._fd)
                self._fd = None
                os.close(self._lock_fd)  # releases the flock

    def __enter__(self) -> "RecoveryLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RecoveryLog({self.path!r})"

    # -- opening -------------------------------------------------------------

    def _acquire_lock(self) -> int:
        lock_path = self.path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise RecoveryLogError(f"cannot open lock file {lock_path}: {e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLockedError(
                f"recovery log {self.path} is in use by another transaction manager "
                f"(lock {lock_path} is held); each manager needs its own log file") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _clean_leftovers(self) -> None:
        """Remove what an interrupted compaction left behind.

        A compaction writes ``<path>.compact-<pid>`` completely, fsyncs it and
        only then renames it over the log, so whatever the instant of a crash,
        ``<path>`` is either the old log or the complete new one: a leftover
        temporary file is never the only copy of anything."""
        folder, base = os.path.split(os.path.abspath(self.path))
        leftovers = [n for n in os.listdir(folder) if n.startswith(base + ".compact-")]
        if not leftovers:
            return
        if not os.path.exists(self.path):
            raise RecoveryLogError(
                f"recovery log {self.path} is missing but {', '.join(leftovers)} (left by an "
                "interrupted compaction) is there; refusing to start -- check the path, or "
                "rename that file to the log's name if the log was deleted by mistake")
        for name in leftovers:
            os.unlink(os.path.join(folder, name))
        log.warning("recovery log %s: removed %s left by an interrupted compaction "
                    "(the log itself is complete)", self.path, ", ".join(leftovers))

    def _open_and_replay(self, create: bool) -> int:
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except FileNotFoundError:
            raise RecoveryLogError(f"there is no recovery log at {self.path} "
                                   "(check the path)") from None
        except OSError as e:
            raise RecoveryLogError(f"cannot open recovery log {self.path}: {e}") from e
        try:
            data = _read_all(fd)
            if len(data) < len(MAGIC) and (MAGIC.startswith(data) or MAGIC_V1.startswith(data)):
                # New file, or a crash while it was being created.
                os.ftruncate(fd, 0)
                _pwrite_all(fd, MAGIC, 0)
                self._sync(fd)
                self._sync_dir()
                self._size = self._allocated = len(MAGIC)
                return fd
            if data.startswith(MAGIC):
                self.format_version = 2
            elif data.startswith(MAGIC_V1):
                self.format_version = 1
            else:
                raise RecoveryLogError(
                    f"{self.path} is not a transaction recovery log (bad header); "
                    "refusing to touch it -- check the log path")
            zeros_from = len(data.rstrip(b"\0"))
            bad = self._replay(data, zeros_from, self.format_version)
            torn_at = _interrupted_append(data, bad, zeros_from, self.format_version)
            if torn_at is not None:
                log.warning("recovery log %s: its last write was cut at byte %d by the death of the "
                            "process that made it (never acknowledged: it was not yet synced); "
                            "%d bytes of it discarded", self.path, zeros_from, zeros_from - torn_at)
                _pwrite_all(fd, b"\0" * (zeros_from - torn_at), torn_at)
                self._sync(fd)
                bad, zeros_from = bad[:-1], torn_at
            self._size = zeros_from if bad else max(len(MAGIC), zeros_from)
            self._allocated = len(data)
            if bad:
                self._record_damage(data, bad)
            if bad or self.format_version == 1:
                fd = self._rewrite_at_open(fd, upgrading=self.format_version == 1)
            if self._ledger.damage:
                log.error("recovery log %s is DAMAGED -- SAFE MODE: intact decisions are used, "
                          "but no in-doubt branch of this node will be presumed aborted; list "
                          "and resolve them with `wsrm recover --log %s`, then end safe mode "
                          "with `wsrm recover --log %s --end-safe-mode` (damage: %s)",
                          self.path, self.path, self.path, "; ".join(self._ledger.damage))
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _replay(self, data: bytes, end: int, version: int) -> list[tuple[int, int, str]]:
        """Apply every intact record before ``end``; return the unreadable spans.

        After a bad record the reader looks for the next place where a
        well-formed record starts (the marker of format 2; the opening of a
        record's JSON in format 1) and goes on from there: one damaged byte
        costs one record, never the ones after it."""
        frame_at = _frame_at_v2 if version == 2 else _frame_at_v1
        resync = _resync_v2 if version == 2 else _resync_v1
        bad: list[tuple[int, int, str]] = []
        off = len(MAGIC)
        while off < end:
            got = frame_at(data, off)
            if isinstance(got, str):
                reason = got
            else:
                payload, nxt = got
                try:
                    self._ledger.apply(json.loads(payload))
                except (ValueError, KeyError, TypeError) as e:
                    reason = f"a record that does not parse ({e})"
                else:
                    off = nxt
                    continue
            resume = resync(data, off + 1, end)
            bad.append((off, resume, reason))
            off = resume
        return bad

    def _record_damage(self, data: bytes, bad: list[tuple[int, int, str]]) -> None:
        """Keep a copy of the damaged file and mark the ledger damaged (SAFE MODE)."""
        copy = f"{self.path}.damaged-{int(time.time())}"
        n = 0
        while os.path.exists(copy):
            n += 1
            copy = f"{self.path}.damaged-{int(time.time())}-{n}"
        try:
            with open(copy, "wb") as f:
                f.write(data.rstrip(b"\0"))
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
        except OSError as e:
            copy = f"(no copy: {e})"
        spans = ", ".join(f"bytes {a}-{b} ({why})" for a, b, why in bad)
        what = (f"{len(bad)} unreadable span(s) found {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{spans}; original kept as {copy}")
        self._ledger.mark_damaged(what)

    def _rewrite_at_open(self, fd: int, *, upgrading: bool) -> int:
        """Replace the file by its live records in the current format (crash-safe)."""
        old_fd = self._fd
        self._fd = fd
        try:
            self._compact_locked()
        except RecoveryLogError as e:
            self._fd = old_fd
            if upgrading:
                raise RecoveryLogError(f"cannot upgrade recovery log {self.path} to the "
                                       f"current format: {e}") from e
            # Safe mode holds anyway: the damage is found again at the next start.
            log.warning("recovery log %s: could not rewrite it after the damage (%s); "
                        "appending after the damaged bytes", self.path, e)
            return fd
        if upgrading:
            log.info("recovery log %s upgraded to format %d", self.path, 2)
            self.format_version = 2
        new_fd = self._fd
        self._fd = old_fd
        assert new_fd is not None
        return new_fd

    # -- appending (group commit) --------------------------------------------

    def _submit(self, payload: bytes, sync: bool, apply: Callable[[], None]) -> None:
        """Write one record (durably when ``sync``), then apply it to the ledger.

        Leader/follower group commit: the first caller to find no write in
        progress becomes the leader, takes every record queued at that
        instant, writes them with one ``pwrite`` and one ``fdatasync``, and
        wakes the others.  Callers that arrive while it writes queue up for
        the next leader.  Nobody returns before the write (and flush) that
        carried their record succeeded; when it failed, every record of the
        batch is cut off again and every caller gets the error.  The ledger
        changes only after the write succeeded, so a compaction can never
        copy a decision that is not durable."""
        item = _Pending(_frame(payload), sync, apply)
        with self._cond:
            if self._fd is None:
                raise RecoveryLogError(f"recovery log {self.path} is closed")
            self._queue.append(item)
            while self._leading and not item.finished:
                self._cond.wait()
            if not item.finished:
                self._leading = True
                batch, self._queue = self._queue, []
                start = self._size
                fd = self._fd
        if not item.finished:
            self._lead(fd, batch, start)
        if item.error is not None:
            raise RecoveryLogError(
                f"cannot write to recovery log {self.path}: {item.error}") from item.error

    def _lead(self, fd: int | None, batch: list[_Pending], start: int) -> None:
        error: OSError | None = None
        end = start
        try:
            if fd is None:
                raise OSError(errno.EBADF, "the log was closed")
            frames = b"".join(p.frame for p in batch)
            end = start + len(frames)
            if end > self._allocated and self._chunk:
                self._preallocate(fd, end)
            written = os.pwrite(fd, frames, start)
            if written != len(frames):  # a short write (a full disk?): finish it, or fail
                _pwrite_all(fd, frames[written:], start + written)
            if self._fsync and any(p.sync for p in batch):
                self._before_sync()
                os.fdatasync(fd)
                self.fsyncs += 1
        except OSError as e:
            error = e
            if fd is not None:
                self._undo_partial_write(fd, start)
        with self._cond:
            try:
                if error is None:
                    self._size = end
                    if end > self._allocated:
                        self._allocated = end
                    for p in batch:
                        p.apply()
                    self._maybe_compact_locked()
            finally:
                for p in batch:
                    p.error = error
                    p.finished = True
                self._leading = False
                self._cond.notify_all()

    def _before_sync(self) -> None:
        """Called by the leader just before its flush (a test waits here to build a group)."""

    def _preallocate(self, fd: int, end: int) -> None:
        """Allocate room up to past ``end``, a whole number of chunks from the start."""
        target = (end // self._chunk + 1) * self._chunk
        try:
            os.posix_fallocate(fd, self._allocated, target - self._allocated)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                self._chunk = 0  # this file system cannot: grow the file as before
            log.debug("recovery log %s: cannot allocate ahead (%s); appending without", self.path, e)
            return
        self._allocated = target

    def _undo_partial_write(self, fd: int, size: int) -> None:
        """Cut off a half-written batch, so no caller told "failed" has a record on disk."""
        try:
            os.ftruncate(fd, size)
            self._allocated = size
            self._sync(fd)
        except OSError as e:
            log.error("recovery log %s: could not cut a failed write back to %d bytes: %s",
                      self.path, size, e)

    def _maybe_compact_locked(self) -> None:
        if self._size > self._next_compact:
            try:
                self._compact_locked()
            except RecoveryLogError as e:
                log.warning("automatic compaction failed, will retry later: %s", e)
                self._next_compact = 2 * self._size

    def _compact_locked(self) -> None:
        """Write the live records to a new file, fsync it, rename it over the log,
        fsync the directory.  A crash at any instant leaves either the old log
        or the complete new one under the log's name (plus, perhaps, a
        temporary file that the next start removes)."""
        if self._fd is None:
            raise RecoveryLogError(f"recovery log {self.path} is closed")
        tmp = f"{self.path}.compact-{os.getpid()}"
        body = MAGIC + b"".join(_frame(p) for p in self._ledger.live_payloads())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _pwrite_all(fd, body, 0)
                self._sync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise RecoveryLogError(f"cannot compact recovery log {self.path}: {e}") from e
        self._sync_dir()
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        log.debug("compacted recovery log %s from %d to %d bytes", self.path, self._size, len(body))
        self._size = self._allocated = len(body)
        self._next_compact = max(self._threshold, 2 * self._size)

    def _sync(self, fd: int) -> None:
        if self._fsync:
            os.fdatasync(fd)
            self.fsyncs += 1

    def _sync_dir(self) -> None:
        if self._fsync:
            _fsync_dir(self.path)
            self.fsyncs += 1


# -- framing ---------------------------------------------------------------------

#: Linux copies a write into the page cache a page at a time and stops between two pages
#: when the process gets a fatal signal (SIGKILL): the write returns short, and the process
#: is gone before it can sync.  The only tear a killed process leaves is at such a boundary.
_WRITE_PAGE = 4096


def _interrupted_append(data: bytes, bad: list[tuple[int, int, str]], end: int, version: int) -> int | None:
    """Where the last append starts, when it is the last unreadable span and was cut by the
    death of its process; None otherwise.

    Its signature: the last record of the log is torn (its header, or the bytes its header
    announces, run past the end of what was written), nothing readable follows it, and what
    was written stops exactly at a page boundary (zeros of the preallocation, or the end of
    the file, after it).  Such a write never returned, so it was never synced nor
    acknowledged: dropping it loses no decision.  Anything else (a tear elsewhere, a bad
    checksum within the written bytes, damage before the end) stays damage: safe mode."""
    if not bad:
        return None
    start, resume, _ = bad[-1]
    if resume != end or end % _WRITE_PAGE:
        return None
    at = start + (len(MARK) if version == 2 else 0)
    if version == 2 and data[start:min(at, end)] != MARK[:min(at, end) - start]:
        return None  # not even the start of a record
    if end - at < _FRAME.size:
        return start  # the header itself is cut
    length, _ = _FRAME.unpack_from(data, at)
    return start if length <= MAX_RECORD and at + _FRAME.size + length > end else None


def _frame(payload: bytes) -> bytes:
    length = _LEN.pack(len(payload))
    return MARK + length + _LEN.pack(zlib.crc32(payload, zlib.crc32(length))) + payload


def _frame_at_v2(data: bytes, off: int) -> tuple[bytes, int] | str:
    """The payload of the format-2 record at ``off`` and where the next starts, or why not."""
    if data[off:off + len(MARK)] != MARK:
        return "bytes that are not a record"
    return _frame_at_v1(data, off + len(MARK))  # after its marker, a record is framed as in format 1


def _resync_v2(data: bytes, start: int, end: int) -> int:
    """Where the next record may start: the next marker (payloads are ASCII, the
    marker is not, so a marker inside an intact record is impossible)."""
    at = data.find(MARK, start, end)
    return end if at < 0 else at


def _frame_at_v1(data: bytes, off: int) -> tuple[bytes, int] | str:
    """The same for format 1 (no marker: ``length | crc | payload``)."""
    if len(data) - off < _FRAME.size:
        return "a torn record header"
    length, crc = _FRAME.unpack_from(data, off)
    body = off + _FRAME.size
    if length > MAX_RECORD or body + length > len(data):
        return f"a record announcing {length} bytes that are not there"
    payload = data[body:body + length]
    if zlib.crc32(payload, zlib.crc32(_LEN.pack(length))) != crc:
        return "a record with a bad checksum"
    return payload, body + length


_V1_OPENING = b'{"t":"'


def _resync_v1(data: bytes, start: int, end: int) -> int:
    """Format 1 has no marker, but every payload opens with ``{"t":"``: the next
    place where a frame ending in such an opening checks out."""
    at = start + _FRAME.size
    while True:
        at = data.find(_V1_OPENING, at, end)
        if at < 0:
            return end
        cand = at - _FRAME.size
        if cand >= start and not isinstance(_frame_at_v1(data, cand), str):
            return cand
        at += 1


def _check_location(path: str, create: bool) -> None:
    """A precise error for a log whose directory (or, when not creating, file) is not there."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise RecoveryLogError(f"the directory of recovery log {path} does not exist "
                               f"({folder}): create it, or fix the path")
    if not create and not os.path.exists(path):
        raise RecoveryLogError(f"there is no recovery log at {path} (check the path)")
    if os.path.isdir(path):
        raise RecoveryLogError(f"recovery log {path} is a directory; give the path of a file")


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, off = [], 0
    while off < size:
        chunk = os.pread(fd, size - off, off)
        if not chunk:
            break
        chunks.append(chunk)
        off += len(chunk)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _fsync_dir(path: str) -> None:
    """Make a create or rename durable (the directory entry is data too)."""
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
