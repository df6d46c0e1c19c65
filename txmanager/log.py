"""The recovery log: the transaction manager's durable memory of its decisions.

Two-phase commit with *presumed abort* needs only one durable fact per
transaction: "these prepared branches are to be committed".  It is written
(and fsynced) after every branch voted yes and before the first phase-2 call;
a transaction with no such record is presumed rolled back.  A "done" record
follows once every branch answered, and heuristic outcomes are kept until an
operator forgets them.  After a crash the recovery manager replays the log to
learn which in-doubt branches to commit.

File format: an 11-byte magic header, then records, each framed as::

    length (uint32 BE) | crc32(length bytes + payload) (uint32 BE) | payload (JSON)

then, while the log is open, zero bytes up to the end of the file.  The file
is written in order by one process (each record with one ``pwrite`` at the
end of the previous one), so a crash can only tear the LAST record.

Why the zero bytes: the space for records is allocated ahead, in chunks
(``posix_fallocate``), so that an append does not change the file's size and
the ``fdatasync`` of a commit decision has no new file size to commit.
Measured on this project's ext4 disk: a third off each sync (median about
140 -> 95 microseconds), the largest single cost of a two-phase commit.  So
a region of zeros where a record would start is the clean end of the log
(the unused allocation of a log that was not closed), not damage; ``close``
gives the unused space back.  A record never ends in a zero byte (its
payload is a JSON object), so "the rest of the file is zeros" is exact.  And
as every ``fdatasync`` flushes all earlier records too, a durable record
never follows a hole: zeros with data after them are damage, reported as
such.

On open the records are read in order and reading stops at the first one
whose frame or checksum is wrong: after a bad record its length field cannot
be trusted, so nothing behind it can be framed safely.  The dropped bytes are
logged at WARNING, copied to ``<path>.corrupt-<time>-<offset>`` for an
operator, and truncated away before anything new is appended.  Start-up
never fails because of a damaged tail; it fails only for a file that is not
a recovery log at all (wrong magic), so a wrong path cannot destroy data.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import LogLockedError, RecoveryLogError
from .xa import XA_HEURCOM, XA_HEURHAZ, XA_HEURMIX, XA_HEURRB
from .xid import Xid

__all__ = ["LogEntry", "TransactionLog", "RecoveryLog", "MemoryLog", "MAGIC"]

log = logging.getLogger(__name__)

MAGIC = b"WSRX-TMLOG1"
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
        out: list[bytes] = []
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

    def close(self) -> None:
        pass


# -- the durable log -------------------------------------------------------------


class RecoveryLog:
    """An append-only, checksummed, fsynced file of transaction decisions.

    ``fsync=False`` skips the flushes (for tests on a machine that must not
    wait on a disk); a crash of the OS can then lose decisions.  The file is
    compacted (rewritten with only the live records) once it grows past
    ``compact_threshold`` bytes.  ``preallocate`` is the size of the chunks in
    which room for records is allocated ahead (see the module docstring for
    why); 0 appends by growing the file.  Thread-safe; one process at a time.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str], fsync: bool = True, *,
                 compact_threshold: int = DEFAULT_COMPACT_THRESHOLD,
                 preallocate: int = DEFAULT_PREALLOCATE) -> None:
        if preallocate < 0:
            raise ValueError("preallocate must be >= 0")
        self.path = os.fspath(path)
        self._fsync = fsync
        self._threshold = compact_threshold
        self._next_compact = compact_threshold
        self._chunk = preallocate
        self._mutex = threading.Lock()
        self._ledger = _Ledger()
        self._fd: int | None = None
        self._size = 0       # where the next record goes
        self._allocated = 0  # the file's size on disk: >= _size, zeros past _size
        self._lock_fd = self._acquire_lock()
        try:
            self._fd = self._open_and_replay()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._next_compact = max(self._threshold, 2 * self._size)

    # -- public API ----------------------------------------------------------

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None:
        """Durably record "commit these branches"; returns only once it is on disk."""
        _check_global(gxid)
        branches = tuple(branches)  # read twice: for the record and for the ledger
        at = time.time()
        payload = _commit_payload(gxid, branches, at)
        with self._mutex:
            self._write_locked(payload, sync=True)
            self._ledger.commit(gxid, branches, at)

    def log_done(self, gxid: Xid) -> None:
        """Every branch answered.  Not fsynced: if lost, recovery re-commits and
        hears XAER_NOTA, which it counts as done."""
        payload = _marker_payload("done", gxid)
        with self._mutex:
            self._write_locked(payload, sync=False)
            self._ledger.done(gxid)
            self._maybe_compact_locked()

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int,
                      resource_name: str | None = None) -> None:
        """Remember a heuristic outcome until :meth:`forget`; fsynced, an operator needs it."""
        _check_heuristic(code)
        payload = _heuristic_payload(gxid, xid, code, resource_name)
        with self._mutex:
            self._write_locked(payload, sync=True)
            self._ledger.heuristic(gxid, xid, code, resource_name)

    def forget(self, gxid: Xid) -> None:
        """Drop the heuristic records of ``gxid`` (the operator has dealt with them)."""
        payload = _marker_payload("forget", gxid)
        with self._mutex:
            self._write_locked(payload, sync=False)
            self._ledger.forget(gxid)
            self._maybe_compact_locked()

    def pending(self) -> dict[Xid, LogEntry]:
        """Decisions without "done", and heuristics not forgotten, by global xid."""
        with self._mutex:
            return self._ledger.pending()

    def is_pending(self, gxid: Xid) -> bool:
        with self._mutex:
            return self._ledger.is_pending(gxid)

    def size(self) -> int:
        """Bytes of records in the file (header included; the unused allocation is not counted)."""
        with self._mutex:
            return self._size

    def compact(self) -> None:
        """Rewrite the file with only the live records (atomically, by rename)."""
        with self._mutex:
            self._compact_locked()

    def close(self) -> None:
        """Close the file, giving back the room allocated ahead for records."""
        with self._mutex:
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

    def _open_and_replay(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise RecoveryLogError(f"cannot open recovery log {self.path}: {e}") from e
        try:
            data = _read_all(fd)
            if len(data) < len(MAGIC) and MAGIC.startswith(data):
                # New file, or a crash while it was being created.
                os.ftruncate(fd, 0)
                _pwrite_all(fd, MAGIC, 0)
                self._sync(fd)
                self._sync_dir()
                self._size = self._allocated = len(MAGIC)
                return fd
            if not data.startswith(MAGIC):
                raise RecoveryLogError(
                    f"{self.path} is not a transaction recovery log (bad header); "
                    "refusing to touch it -- check the log path")
            zeros_from = len(data.rstrip(b"\0"))
            end, reason = self._replay(data, zeros_from)
            self._size = end
            self._allocated = len(data)
            if end < zeros_from:
                self._drop_tail(fd, data[end:zeros_from], end, reason)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _replay(self, data: bytes, zeros_from: int) -> tuple[int, str]:
        """Apply every good record; return where the good part ends and why it ends.

        Everything from ``zeros_from`` on is zero bytes: unused allocation,
        where reading stops without complaint.
        """
        off = len(MAGIC)
        while off < zeros_from:
            if len(data) - off < _FRAME.size:
                return off, "a torn record header"
            length, crc = _FRAME.unpack_from(data, off)
            body = off + _FRAME.size
            if length > MAX_RECORD or body + length > len(data):
                return off, f"a record announcing {length} bytes that are not there"
            payload = data[body:body + length]
            if zlib.crc32(payload, zlib.crc32(_LEN.pack(length))) != crc:
                return off, "a record with a bad checksum"
            try:
                self._ledger.apply(json.loads(payload))
            except (ValueError, KeyError, TypeError) as e:
                return off, f"a record that does not parse ({e})"
            off = body + length
        return off, ""

    def _drop_tail(self, fd: int, damaged: bytes, end: int, reason: str) -> None:
        """Cut the log at ``end``; ``damaged`` is what follows up to the last non-zero byte."""
        saved = f"{self.path}.corrupt-{int(time.time())}-{end}"
        try:
            with open(saved, "wb") as f:
                f.write(damaged)
        except OSError as e:
            saved = f"(not saved: {e})"
        log.warning("recovery log %s: found %s at byte %d; ignoring the %d bytes from there "
                    "to the end (a crash tears only the last record; if this was not a crash, "
                    "decisions after it are lost) -- copy kept in %s",
                    self.path, reason, end, len(damaged), saved)
        os.ftruncate(fd, end)
        self._allocated = end
        self._sync(fd)

    # -- appending -----------------------------------------------------------

    def _write_locked(self, payload: bytes, *, sync: bool) -> None:
        """Write one record after the last one (and flush it when ``sync``)."""
        fd = self._fd
        if fd is None:
            raise RecoveryLogError(f"recovery log {self.path} is closed")
        frame = _frame(payload)
        end = self._size + len(frame)
        if end > self._allocated and self._chunk:
            self._preallocate(fd, end)
        try:
            written = os.pwrite(fd, frame, self._size)
            if written != len(frame):  # a short write (a full disk?): finish it, or fail
                _pwrite_all(fd, frame[written:], self._size + written)
            if sync and self._fsync:
                os.fdatasync(fd)
        except OSError as e:
            self._undo_partial_write()
            raise RecoveryLogError(
                f"cannot write to recovery log {self.path}: {e}") from e
        self._size = end
        if end > self._allocated:
            self._allocated = end

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

    def _undo_partial_write(self) -> None:
        """Cut off a half-written record, so later records stay readable."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
            self._allocated = self._size
            self._sync(self._fd)
        except OSError as e:
            log.error("recovery log %s: could not cut a failed write back to %d bytes: %s",
                      self.path, self._size, e)

    def _maybe_compact_locked(self) -> None:
        if self._size > self._next_compact:
            try:
                self._compact_locked()
            except RecoveryLogError as e:
                log.warning("automatic compaction failed, will retry later: %s", e)
                self._next_compact = 2 * self._size

    def _compact_locked(self) -> None:
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

    def _sync_dir(self) -> None:
        if self._fsync:
            _fsync_dir(self.path)


def _frame(payload: bytes) -> bytes:
    length = _LEN.pack(len(payload))
    return length + _LEN.pack(zlib.crc32(payload, zlib.crc32(length))) + payload


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
