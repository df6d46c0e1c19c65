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

The file is append-only (``O_APPEND``), so a crash can only tear the LAST
record.  On open the records are read in order and reading stops at the first
one whose frame or checksum is wrong: after a bad record its length field
cannot be trusted, so nothing behind it can be framed safely.  The dropped
bytes are logged at WARNING, copied to ``<path>.corrupt-<time>-<offset>`` for
an operator, and truncated away before anything new is appended.  Start-up
never fails because of a damaged tail; it fails only for a file that is not
a recovery log at all (wrong magic), so a wrong path cannot destroy data.

Only one process may append to a log: an exclusive ``fcntl.flock`` on
``<path>.lock`` is held while it is open.
"""

from __future__ import annotations

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
    """The live state replayed from records: one place that knows their meaning."""

    def __init__(self) -> None:
        self._entries: dict[Xid, dict[str, Any]] = {}

    def apply(self, rec: Mapping[str, Any]) -> None:
        """Apply one record; raises ValueError/KeyError/TypeError when it is malformed."""
        kind = rec["t"]
        gxid = Xid.from_text(rec["g"])
        entry = self._entries.get(gxid)
        if kind == "commit":
            branches = {Xid.from_text(x): str(name) for x, name in rec["b"]}
            if entry is None:
                entry = self._entries[gxid] = _new_entry()
            entry["branches"].update(branches)
            entry["committing"] = True
            entry["at"] = float(rec["at"])
        elif kind == "heur":
            code = int(rec["c"])
            if code not in _HEURISTIC_CODES:
                raise ValueError(f"heuristic record with non-heuristic code {code}")
            xid = Xid.from_text(rec["x"])
            if entry is None:
                entry = self._entries[gxid] = _new_entry()
            entry["heuristics"][xid] = code
            if rec.get("r") is not None:
                entry["branches"].setdefault(xid, str(rec["r"]))
        elif kind == "done":
            if entry is not None:
                entry["committing"] = False
                if not entry["heuristics"]:
                    del self._entries[gxid]
        elif kind == "forget":
            if entry is not None:
                entry["heuristics"].clear()
                if not entry["committing"]:
                    del self._entries[gxid]
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

    def live_records(self) -> list[dict[str, Any]]:
        """The fewest records that rebuild the current state (for compaction)."""
        out: list[dict[str, Any]] = []
        for g, e in self._entries.items():
            if e["committing"]:
                out.append(_commit_record(g, e["branches"].items(), e["at"]))
            for xid, code in e["heuristics"].items():
                out.append(_heuristic_record(g, xid, code, e["branches"].get(xid)))
        return out


def _new_entry() -> dict[str, Any]:
    return {"branches": {}, "committing": False, "heuristics": {}, "at": None}


def _commit_record(gxid: Xid, branches, at: float | None) -> dict[str, Any]:
    return {"t": "commit", "g": gxid.to_text(),
            "b": [[x.to_text(), name] for x, name in branches],
            "at": time.time() if at is None else at}


def _heuristic_record(gxid: Xid, xid: Xid, code: int, resource_name: str | None) -> dict[str, Any]:
    return {"t": "heur", "g": gxid.to_text(), "x": xid.to_text(), "c": code, "r": resource_name}


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

    def _record(self, rec: dict[str, Any]) -> None:
        with self._mutex:
            self._ledger.apply(rec)

    def log_commit_decision(self, gxid: Xid, branches: Sequence[tuple[Xid, str]]) -> None:
        _check_global(gxid)
        self._record(_commit_record(gxid, branches, None))

    def log_done(self, gxid: Xid) -> None:
        self._record({"t": "done", "g": gxid.to_text()})

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int,
                      resource_name: str | None = None) -> None:
        _check_heuristic(code)
        self._record(_heuristic_record(gxid, xid, code, resource_name))

    def forget(self, gxid: Xid) -> None:
        self._record({"t": "forget", "g": gxid.to_text()})

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
    ``compact_threshold`` bytes.  Thread-safe; one process at a time.
    """

    durable = True

    def __init__(self, path: str | os.PathLike[str], fsync: bool = True, *,
                 compact_threshold: int = DEFAULT_COMPACT_THRESHOLD) -> None:
        self.path = os.fspath(path)
        self._fsync = fsync
        self._threshold = compact_threshold
        self._next_compact = compact_threshold
        self._mutex = threading.Lock()
        self._ledger = _Ledger()
        self._fd: int | None = None
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
        self._append(_commit_record(gxid, branches, None), sync=True)

    def log_done(self, gxid: Xid) -> None:
        """Every branch answered.  Not fsynced: if lost, recovery re-commits and
        hears XAER_NOTA, which it counts as done."""
        self._append({"t": "done", "g": gxid.to_text()}, sync=False, may_compact=True)

    def log_heuristic(self, gxid: Xid, xid: Xid, code: int,
                      resource_name: str | None = None) -> None:
        """Remember a heuristic outcome until :meth:`forget`; fsynced, an operator needs it."""
        _check_heuristic(code)
        self._append(_heuristic_record(gxid, xid, code, resource_name), sync=True)

    def forget(self, gxid: Xid) -> None:
        """Drop the heuristic records of ``gxid`` (the operator has dealt with them)."""
        self._append({"t": "forget", "g": gxid.to_text()}, sync=False, may_compact=True)

    def pending(self) -> dict[Xid, LogEntry]:
        """Decisions without "done", and heuristics not forgotten, by global xid."""
        with self._mutex:
            return self._ledger.pending()

    def is_pending(self, gxid: Xid) -> bool:
        with self._mutex:
            return self._ledger.is_pending(gxid)

    def size(self) -> int:
        """Bytes in the file (header included)."""
        with self._mutex:
            return self._size

    def compact(self) -> None:
        """Rewrite the file with only the live records (atomically, by rename)."""
        with self._mutex:
            self._compact_locked()

    def close(self) -> None:
        with self._mutex:
            if self._fd is not None:
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
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise RecoveryLogError(f"cannot open recovery log {self.path}: {e}") from e
        try:
            data = _read_all(fd)
            if len(data) < len(MAGIC) and MAGIC.startswith(data):
                # New file, or a crash while it was being created.
                os.ftruncate(fd, 0)
                os.write(fd, MAGIC)
                self._sync(fd)
                self._sync_dir()
                self._size = len(MAGIC)
                return fd
            if not data.startswith(MAGIC):
                raise RecoveryLogError(
                    f"{self.path} is not a transaction recovery log (bad header); "
                    "refusing to touch it -- check the log path")
            end, reason = self._replay(data)
            if end < len(data):
                self._drop_tail(fd, data, end, reason)
            self._size = end
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _replay(self, data: bytes) -> tuple[int, str]:
        """Apply every good record; return where the good part ends and why it ends."""
        off = len(MAGIC)
        while off < len(data):
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

    def _drop_tail(self, fd: int, data: bytes, end: int, reason: str) -> None:
        dropped = len(data) - end
        saved = f"{self.path}.corrupt-{int(time.time())}-{end}"
        try:
            with open(saved, "wb") as f:
                f.write(data[end:])
        except OSError as e:
            saved = f"(not saved: {e})"
        log.warning("recovery log %s: found %s at byte %d; ignoring the %d bytes from there "
                    "to the end (a crash tears only the last record; if this was not a crash, "
                    "decisions after it are lost) -- copy kept in %s",
                    self.path, reason, end, dropped, saved)
        os.ftruncate(fd, end)
        self._sync(fd)

    # -- appending -----------------------------------------------------------

    def _append(self, rec: dict[str, Any], *, sync: bool, may_compact: bool = False) -> None:
        payload = json.dumps(rec, separators=(",", ":")).encode()
        frame = _frame(payload)
        with self._mutex:
            if self._fd is None:
                raise RecoveryLogError(f"recovery log {self.path} is closed")
            try:
                _write_all(self._fd, frame)
                if sync:
                    self._sync(self._fd)
            except OSError as e:
                self._undo_partial_write()
                raise RecoveryLogError(
                    f"cannot write to recovery log {self.path}: {e}") from e
            self._size += len(frame)
            self._ledger.apply(rec)
            if may_compact and self._size > self._next_compact:
                try:
                    self._compact_locked()
                except RecoveryLogError as e:
                    log.warning("automatic compaction failed, will retry later: %s", e)
                    self._next_compact = 2 * self._size

    def _undo_partial_write(self) -> None:
        """Cut off a half-written record, so later records stay readable."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._size)
            self._sync(self._fd)
        except OSError as e:
            log.error("recovery log %s: could not cut a failed write back to %d bytes: %s",
                      self.path, self._size, e)

    def _compact_locked(self) -> None:
        assert self._fd is not None
        tmp = f"{self.path}.compact-{os.getpid()}"
        body = MAGIC + b"".join(
            _frame(json.dumps(r, separators=(",", ":")).encode())
            for r in self._ledger.live_records())
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, body)
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
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        log.debug("compacted recovery log %s from %d to %d bytes", self.path, self._size, len(body))
        self._size = len(body)
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(path: str) -> None:
    """Make a create or rename durable (the directory entry is data too)."""
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
