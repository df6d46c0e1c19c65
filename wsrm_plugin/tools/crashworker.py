"""A process that runs bank transfers and dies (SIGKILL) where it is told to.

The crash tests and the demo start it as ``python -m wsrm_plugin.tools.crashworker`` and
then recover in a fresh process.  Dying by SIGKILL, rather than by an exception,
is the point: no ``finally``, no atexit, no flush, exactly like a power cut of
the application (the kernel still has what was written, which is why the log
fsyncs).

Kill points are the transaction manager's checkpoints (see
:class:`txmanager.manager.TransactionManager`): ``before_prepare``,
``prepared:I``, ``before_log``, ``logged``, ``committed:I``, ``before_done``,
``before_commit_one_phase`` (with ``--commit-marks``, ``before_log`` and
``logged`` are the instants before and after bank B's commit with the mark);
``--kill-tx N`` picks the transaction (0-based)
in which to die.  ``--kill-after SECONDS`` dies at a random instant instead.
``--kill-server-pid`` makes the kill point SIGKILL the PostgreSQL postmaster
rather than this process, to crash the database mid-commit.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from wsrm_plugin.tools.bank import random_transfers
from txmanager.manager import TransactionManager
from txmanager.postgres import XADataSource

log = logging.getLogger(__name__)


def _parse_point(text: str) -> tuple[str, int]:
    name, _, index = text.partition(":")
    return name, int(index or 0)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (PostgreSQL backends of a postmaster), from /proc."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its children at once: a server crash kills every backend.

    Killing only the postmaster is not a crash of the server: its backends
    live on for a moment and may still answer a COMMIT PREPARED.
    """
    for victim in [pid, *_children(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _Killer:
    """The checkpoint callback: counts transactions and kills at the chosen point."""

    def __init__(self, point: tuple[str, int] | None, tx_number: int, target_pid: int) -> None:
        self.point = point
        self.tx_number = tx_number
        self.target_pid = target_pid
        self.tx_seen = -1
        self.fired = False

    def __call__(self, name: str, index: int) -> None:
        if name in ("before_prepare", "before_commit_one_phase"):
            self.tx_seen += 1
        if self.fired or self.point is None or self.tx_seen != self.tx_number:
            return
        if (name, index) == self.point:
            self.fired = True
            log.warning("kill point %s:%d of transaction %d reached", name, index, self.tx_seen)
            if self.target_pid == os.getpid():
                os.kill(self.target_pid, signal.SIGKILL)
            _kill_tree(self.target_pid)
            if self.target_pid == os.getpid():  # pragma: no cover - never returns
                signal.pause()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m wsrm_plugin.tools.crashworker", description=__doc__)
    p.add_argument("--dsn-a", required=True)
    p.add_argument("--dsn-b", required=True)
    p.add_argument("--log", required=True, help="recovery log path")
    p.add_argument("--node", default="crash-node")
    p.add_argument("--transfers", type=int, default=10)
    p.add_argument("--accounts", type=int, default=10)
    p.add_argument("--prefix", default="t")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--kill-at", type=_parse_point, default=None, metavar="POINT[:INDEX]")
    p.add_argument("--kill-tx", type=int, default=0)
    p.add_argument("--kill-after", type=float, default=None, metavar="SECONDS")
    p.add_argument("--kill-server-pid", type=int, default=None)
    p.add_argument("--commit-marks", action="store_true",
                   help="bank B keeps commit marks: it commits last, in one phase, with the "
                        "decision (txmanager.marks), instead of a log write")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="crashworker: %(message)s")

    killer = _Killer(args.kill_at, args.kill_tx, args.kill_server_pid or os.getpid())
    if args.kill_after is not None:
        timer = threading.Timer(args.kill_after, os.kill, (os.getpid(), signal.SIGKILL))
        timer.daemon = True
        timer.start()
    tm = TransactionManager(node=args.node, log=args.log, checkpoint=killer)
    bank_a = XADataSource(args.dsn_a, tm)
    bank_b = XADataSource(args.dsn_b, tm, commit_marks=args.commit_marks)
    try:
        done = random_transfers(
            tm, bank_a, bank_b, args.transfers, args.accounts, args.prefix, args.seed
        )
    except Exception as exc:  # the server may have been killed under us
        log.warning("stopped after an error: %s: %s", type(exc).__name__, exc)
        return 3
    finally:
        if not killer.fired or args.kill_server_pid:
            tm.close()
    log.warning("%d transfers committed", done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
