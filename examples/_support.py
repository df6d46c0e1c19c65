"""Small helpers the examples share: a quick policy, waiting, peer processes and the result line.

Nothing here is needed to use the library; it keeps the examples short.
Every example ends with the line :func:`report` prints,
``delivered N of M, lost L, duplicated D``, which its test reads.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.tools.proxy import LossyProxy

HERE = Path(__file__).resolve().parent


def example_policy(**overrides: Any) -> RMPolicy:
    """Retransmit after 0.2 s instead of 3 s so a lost message costs the demo little time.

    SOAP 1.1 because the example services are spyne ``Soap11`` applications.
    """
    settings: dict[str, Any] = dict(base_retransmission_interval=0.2, exponential_backoff=False,
                                    poll_interval=0.05, http_timeout=5.0, soap_version="1.1")
    settings.update(overrides)
    return RMPolicy(**settings)


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(interval)


def lossy_proxy(target: str, loss: float, seed: int = 4) -> LossyProxy:
    """A started proxy to ``target`` that drops ``loss`` of the requests (seeded: replayable)."""
    return LossyProxy(target, drop=loss, seed=seed).start()


def report(expected: Iterable[str], received: Iterable[str]) -> bool:
    """Print the result line every example ends with; True when each item arrived exactly once."""
    expected = list(expected)
    counts = collections.Counter(received)
    delivered = sum(1 for item in set(expected) if counts[item] >= 1)
    lost = len(set(expected)) - delivered
    duplicated = sum(n - 1 for n in counts.values() if n > 1)
    unexpected = sum(n for item, n in counts.items() if item not in set(expected))
    line = f"delivered {delivered} of {len(expected)}, lost {lost}, duplicated {duplicated}"
    if unexpected:
        line += f", unexpected {unexpected}"
    print(line, flush=True)
    return lost == 0 and duplicated == 0 and unexpected == 0


def free_port() -> int:
    """A port to serve on across restarts, below the ones the kernel hands to outgoing connections."""
    from wsrm_plugin.engine.transport import free_port as below_the_ephemeral_range

    return below_the_ephemeral_range()


class Peer:
    """This example run again as a child process (``python example.py ROLE ...``) that we may SIGKILL.

    The child prints ``READY`` (and anything after it on that line) once it
    serves; stdout after that is free.  Closing its stdin asks it to stop.
    """

    def __init__(self, script: str, *args: str, log: Path | None = None, ready_timeout: float = 60.0) -> None:
        self.args = [sys.executable, script, *args]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
        self._log = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.child = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._log, text=True, env=env)
        self.ready = self._read_ready(ready_timeout)

    def _read_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.child.stdout.readline()
            if line.startswith("READY"):
                return line[len("READY"):].strip()
            if not line and self.child.poll() is not None:
                break
        self.kill()
        raise RuntimeError(f"{' '.join(self.args[1:3])} did not start (exit {self.child.returncode}); "
                           "see its log")

    @property
    def alive(self) -> bool:
        return self.child.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup, no flush, no goodbye; exactly what a crash looks like."""
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=30)
        self._close()

    def stop(self, timeout: float = 30.0) -> int:
        """Ask the child to finish (close its stdin) and wait; returns its exit status."""
        if self.child.poll() is None:
            try:
                self.child.stdin.close()
                self.child.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                self.child.kill()
                self.child.wait(timeout=30)
        self._close()
        return self.child.returncode

    def _close(self) -> None:
        for pipe in (self.child.stdin, self.child.stdout):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:
                    pass
        if self._log is not subprocess.DEVNULL and not self._log.closed:
            self._log.close()


def serve_until_stdin_closes() -> None:
    """What a peer process does once it printed READY: run until the parent closes our stdin."""
    try:
        sys.stdin.read()
    except KeyboardInterrupt:
        pass


def quiet_logging() -> None:
    """Warnings and errors on stderr, one line each; spyne's traceback of an expected Fault left out."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("spyne").setLevel(logging.CRITICAL)


def crash_and_restart(peers: dict[str, Peer], restart: dict[str, Callable[[], Peer]],
                      progress: dict[str, Callable[[], int]], total: int, kills: int,
                      timeout: float = 120.0) -> list[str]:
    """SIGKILL the peers in turn (client, server, client, ...) as the work goes by, restarting each at once.

    Kill ``k`` (of ``kills``) hits role ``k % len(roles)`` as soon as that
    role's ``progress()`` reached ``total * (k + 1) / (kills + 1)``: the
    crashes are spread over the run, and each lands while messages are still
    in flight.  Returns what was done, one line per kill, for the output.
    """
    roles = list(peers)
    done: list[str] = []
    for k in range(kills):
        role = roles[k % len(roles)]
        mark = total * (k + 1) / (kills + 1)
        wait_for(lambda: progress[role]() >= mark or not peers[role].alive, timeout=timeout, interval=0.02)
        at = progress[role]()
        peers[role].kill()
        peers[role] = restart[role]()
        done.append(f"killed the {role} (SIGKILL) at {at}/{total}, restarted it")
        print(done[-1], flush=True)
    return done
