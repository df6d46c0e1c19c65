"""Counts of what processes did, by group, with ``perf stat``: CPU, thread switches and system
calls (the round trips of a PostgreSQL backend are its ``sendto`` calls: one answer each).

``bench_compare``'s ``BENCH_PERF_STAT=1`` attaches it to the client and the service processes and
to the PostgreSQL backends of each side once a tenth of a round is in, and prints each group's
counts per message.  Counting (no sampling) costs the processes little, unlike ``strace``; the
counts say what each process did whatever the machine's load.  New threads of a process are
counted (perf inherits them); a backend started after the attach is counted in the postmaster's
group.  Needs ``perf`` (Linux) and the right to trace the processes.  A measuring tool only.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

#: (event, the name printed): CPU, switches, every system call, and those that say what a
#: process waited for or sent (sendto: a backend's answer, a client's request; recvfrom: reads;
#: futex: thread hand-overs, the GIL; poll and epoll_wait: waits for a socket; fdatasync: flushes)
EVENTS: tuple[tuple[str, str], ...] = (
    ("task-clock", "cpu ms"),
    ("context-switches", "switches"),
    ("raw_syscalls:sys_enter", "syscalls"),
    ("syscalls:sys_enter_sendto", "sendto"),
    ("syscalls:sys_enter_recvfrom", "recvfrom"),
    ("syscalls:sys_enter_futex", "futex"),
    ("syscalls:sys_enter_poll", "poll"),
    ("syscalls:sys_enter_epoll_wait", "epoll_wait"),
    ("syscalls:sys_enter_fdatasync", "fdatasync"),
    ("syscalls:sys_enter_pwrite64", "pwrite"),
)


class PerfStat:
    """``perf stat`` counting :data:`EVENTS` on some processes (and the threads and children
    they start after it) from :meth:`start` to :meth:`stop`."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = sorted(set(pids))
        self._dir = Path(tempfile.mkdtemp(prefix="perf-stat-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("perf") is not None

    def start(self) -> None:
        if not self.pids:
            return
        events = ",".join(name for name, _ in EVENTS)
        self._proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", events, "-o", str(self._dir / "stat.csv"),
             "-p", ",".join(map(str, self.pids))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, float]:
        """The counts by :data:`EVENTS`' printed names (``cpu ms`` in milliseconds); empty when
        perf could not count."""
        if self._proc is None:
            return {}
        self._proc.send_signal(signal.SIGINT)
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        names = dict(EVENTS)
        counts: dict[str, float] = {}
        try:
            text = (self._dir / "stat.csv").read_text(errors="replace")
        except OSError:
            return {}
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        for line in text.splitlines():
            fields = line.split(",")
            if len(fields) < 3 or line.startswith("#"):
                continue
            event = fields[2]
            name = names.get(event)
            if name is None:
                continue
            try:
                counts[name] = float(fields[0])
            except ValueError:  # "<not counted>", "<not supported>"
                continue
        return counts


def report(groups: dict[str, dict[str, float]], messages: int) -> list[str]:
    """One line a group: each count per message."""
    lines = [f"per message, by process group (perf stat, {messages} messages):"]
    for group, counts in groups.items():
        if counts:
            lines.append(f"  {group:22} " + " ".join(f"{name}={counts.get(name, 0.0) / max(1, messages):.2f}"
                                                     for _, name in EVENTS))
    return lines
