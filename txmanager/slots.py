"""Node names for several processes of one service: slots claimed with the recovery log's lock.

A transaction manager's node name must be unique among the processes that
share a resource, and stable across restarts: recovery after a crash reads
the dead process's log and resolves only the branches carrying its node
name.  Under gunicorn (or any pre-fork server) the workers are identical
copies and a killed worker is replaced by a new process with a new PID, so
PID-based names leave a log behind at every crash that nobody reads, with
its prepared branches holding their row locks.

:class:`NodeSlots` is a directory of slots ``<prefix>-0``, ``<prefix>-1``...,
each a node name with its recovery log ``<prefix>-<n>.log``.  A process
claims the lowest slot whose log no live process holds: the log's exclusive
``flock`` is the claim, so the kernel releases it when its holder dies, even
by SIGKILL, and a respawned worker takes the dead one's slot, its name and
its log; its start-up recovery then finishes the dead worker's
transactions.  No lease to expire, no clock.

Because a slot's name is held by one process at a time, every prepared
branch of that node that is not running in the holder belongs to a dead
process: the managers :meth:`NodeSlots.claim` builds use a safety interval of
0 (the holder's own running transactions are never touched by its
recovery), so a dead worker's undecided branches are rolled back at once
instead of holding their locks for a minute.

A slot nobody re-takes (the service scaled down, a worker that failed to
start) is an orphan: :meth:`NodeSlots.recover_orphans`, run by every live
holder in the background (:meth:`NodeSlots.start_sweeper`), resolves its
transactions with the holder's resources, holding the orphan's lock meanwhile.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import LogLockedError
from .log import RecoveryLog
from .manager import TransactionManager
from .recovery import RecoveryManager, RecoveryReport
from .xa import XAResource

__all__ = ["NodeSlots", "NoFreeSlotError"]

log = logging.getLogger(__name__)


class NoFreeSlotError(RuntimeError):
    """Every slot stayed held by a live process for the whole wait."""


class NodeSlots:
    """The slots ``<prefix>-<n>`` in ``directory`` (see the module docstring).

    ``size`` bounds the number of slots (then :meth:`claim` waits for one to
    free up); None lets a process take a new slot when all are held.  Give
    every service its own ``prefix``: the node names must be unique among all
    the processes sharing a database.
    """

    def __init__(self, directory: str | os.PathLike[str], prefix: str, size: int | None = None) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.]+", prefix):
            raise ValueError(f"slot prefix {prefix!r}: use letters, digits, '_' and '.' only")
        if size is not None and size < 1:
            raise ValueError(f"size must be >= 1 or None, not {size!r}")
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"the slot directory {self.directory} does not exist: create it "
                                    "(on a disk that survives a restart) before starting the service")
        self.prefix = prefix
        self.size = size
        self._pattern = re.compile(re.escape(prefix) + r"-(\d+)\.log")
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        self._free_since: dict[int, float] = {}

    def node(self, index: int) -> str:
        return f"{self.prefix}-{index}"

    def log_path(self, index: int) -> Path:
        return self.directory / f"{self.node(index)}.log"

    def existing(self) -> list[int]:
        """The slots that ever had a log here, in order."""
        found = [int(m.group(1)) for p in self.directory.iterdir() if (m := self._pattern.fullmatch(p.name))]
        return sorted(found)

    def claim(self, timeout: float = 60.0, *, new_slot_after: float = 1.0, **tm_options: Any) -> TransactionManager:
        """A transaction manager on the lowest free slot, waiting up to ``timeout`` seconds for one.

        Without a ``size``, a new slot is opened only when every known slot
        stayed held for ``new_slot_after`` seconds: a dead worker's slot may be
        held for a moment by another process checking it, and its respawned
        successor should take it back rather than start a new log.
        ``tm_options`` go to :class:`~txmanager.TransactionManager`
        (``safety_interval`` defaults to 0, see the module docstring).
        """
        tm_options.setdefault("safety_interval", 0.0)
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            if self.size is not None:
                candidates: Iterable[int] = range(self.size)
            else:
                known = self.existing()
                top = max(known, default=-1) + 1
                candidates = range(top + 1 if waited >= new_slot_after or not known else top)
            for index in candidates:
                try:
                    tm = TransactionManager(node=self.node(index), log=self.log_path(index), **tm_options)
                except LogLockedError:
                    continue
                log.info("process %d holds transaction-manager slot %s (log %s)", os.getpid(),
                         tm.node, self.log_path(index))
                return tm
            if waited >= timeout:
                if self.size is None:  # a timeout shorter than new_slot_after: no new slot was tried yet
                    raise NoFreeSlotError(f"every known slot {self.prefix}-* in {self.directory} is held by live "
                                          f"processes and none became free in {timeout}s (a new slot is opened "
                                          f"after {new_slot_after}s)")
                raise NoFreeSlotError(f"all {self.size} slots {self.prefix}-0..{self.prefix}-{self.size - 1} in "
                                      f"{self.directory} are held by live processes: run at most {self.size} "
                                      "processes, or raise the size")
            time.sleep(0.1)

    def is_free(self, index: int) -> bool:
        """No live process holds slot ``index`` (its log's lock is taken and released at once)."""
        fd = os.open(f"{self.log_path(index)}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing releases the lock
        return True

    def recover_orphans(self, resources: Iterable[XAResource], exclude: str | None = None,
                        grace: float = 0.0) -> dict[str, RecoveryReport]:
        """Resolve the transactions of every slot no live process holds; the reports by node.

        ``grace``: only slots seen free for that many seconds (by earlier
        calls on this object), so that a respawning worker takes its
        predecessor's slot back first.  Each orphan's log is held (locked)
        while its recovery runs, so a process starting meanwhile waits.
        """
        reports: dict[str, RecoveryReport] = {}
        resources = list(resources)
        now = time.monotonic()
        for index in self.existing():
            node = self.node(index)
            if node == exclude or not self.is_free(index):
                self._free_since.pop(index, None)
                continue
            if now - self._free_since.setdefault(index, now) < grace:
                continue
            try:
                orphan_log = RecoveryLog(self.log_path(index))
            except LogLockedError:
                continue  # taken meanwhile: its new holder recovers it
            try:
                report = RecoveryManager(orphan_log, resources, node, safety_interval=0.0).recover_once()
            finally:
                orphan_log.close()
            if report.acted or report.errors:
                log.warning("recovered the transactions of orphan slot %s: %s", node, report.summary())
            reports[node] = report
        return reports

    def start_sweeper(self, tm: TransactionManager, interval: float = 10.0, grace: float | None = None) -> None:
        """Every ``interval`` seconds, :meth:`recover_orphans` with ``tm``'s resources (a daemon thread).

        ``grace`` (default: ``interval``, at least 5 s) leaves a free slot to
        the worker that replaces its dead holder before sweeping it.
        """
        if self._sweeper is not None:
            return
        self._stop.clear()
        wait = max(interval, 5.0) if grace is None else grace

        def sweep() -> None:
            while not self._stop.wait(interval):
                try:
                    self.recover_orphans(list(tm._resources), exclude=tm.node, grace=wait)
                except Exception:  # noqa: BLE001 -- a sweep that fails is retried at the next one
                    log.exception("recovering orphan slots failed; retrying in %s s", interval)

        self._sweeper = threading.Thread(target=sweep, name=f"tm-slot-sweeper-{tm.node}", daemon=True)
        self._sweeper.start()

    def stop_sweeper(self, timeout: float = 10.0) -> None:
        thread, self._sweeper = self._sweeper, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout)
