"""An asyncio program's reliable calls survive a SIGKILL: 500 one-way and 100 request-reply calls.

Real processes: the demo's reliable spyne server (:mod:`wsrm_plugin.tools.demo_peer`) and the
asyncio client program (:mod:`tests.aio.client_program`), each with a SQLite store, the lossy
proxy between them.  The client is SIGKILLed once, among its request-reply calls, and
restarted: every call reaches the service exactly once and in order, every reply reaches the
persisted callback exactly once, and the loop's slowest callback is printed (none of its callbacks
may run what blocks: the engine, the store, zeep, an import; see :mod:`tests.aio.loopwatch`).  About 60-120 s here.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aio.client_program import REPLY_TABLE, in_out_item, one_way_item
from wsrm_plugin.engine.transport import free_port as _free_port
from wsrm_plugin.tools.demo_peer import SERVER_TABLE
from wsrm_plugin.tools.proxy import LossyProxy

ROOT = Path(__file__).resolve().parents[2]
ONE_WAY, IN_OUT = 500, 100
KILL_AT = ONE_WAY + 40  # among the request-reply calls


class Lines:
    """A child's stdout, line by line, read in a thread; wait for a line that starts with a prefix."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("<EOF>")
            self._changed.notify_all()

    def wait(self, prefix: str, timeout: float) -> str:
        with self._changed:
            found = self._changed.wait_for(
                lambda: any(line.startswith(prefix) or line == "<EOF>" for line in self.lines), timeout)
            line = next((line for line in self.lines if line.startswith(prefix)), None)
        assert found and line is not None, f"no {prefix!r} line in {timeout} s: {self.lines[-20:]}"
        return line


def _spawn(args: list[str], tmp: Path, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *args], cwd=tmp, env=env, stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.PIPE, stderr=open(tmp / f"{name}.log", "ab"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    proc = _spawn(["-m", "wsrm_plugin.tools.demo_peer", "server", "--store", f"sqlite:///{tmp_path}/server.db",
                   "--port", str(port), "--records", "store"], tmp_path, "server")
    try:
        Lines(proc).wait("READY", 60)
        yield f"http://127.0.0.1:{port}/"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


def _rows(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return list(conn.execute(sql))
    finally:
        conn.close()


@pytest.mark.slow
def test_an_asyncio_client_killed_and_restarted_delivers_every_call_once_in_order(server, tmp_path):
    with LossyProxy(server, drop=0.1, drop_response=0.1, seed=34) as proxy:
        listen_port = _free_port()
        args = ["-m", "tests.aio.client_program", "--wsdl", proxy.url + "?wsdl",
                "--store", f"sqlite:///{tmp_path}/client.db", "--listen-port", str(listen_port),
                "--one-way", str(ONE_WAY), "--in-out", str(IN_OUT)]
        first = _spawn(args, tmp_path, "client-1")
        lines = Lines(first)
        lines.wait(f"ENQUEUED {KILL_AT}", 300)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        before_kill = next(line for line in lines.lines if line.startswith("RESUMED"))
        second = _spawn(args, tmp_path, "client-2")
        again = Lines(second)
        resumed = again.wait("RESUMED", 60)
        done = again.wait("DONE", 600)
        assert second.stdin is not None
        second.stdin.close()
        second.wait(60)
        assert second.returncode == 0, (tmp_path / "client-2.log").read_text()[-3000:]
    loop_line = again.wait("LOOP", 1)
    print(f"\nfirst run: {before_kill}; killed after ENQUEUED {KILL_AT}; second run: {resumed}")
    print(f"the restarted client's event loop: {loop_line[5:]}")
    assert done == "DONE"

    served = [item for (item,) in _rows(tmp_path / "server.db", f"SELECT item FROM {SERVER_TABLE} ORDER BY rowid")]
    assert [i for i in served if i.startswith("m")] == [one_way_item(n) for n in range(1, ONE_WAY + 1)]
    assert [i for i in served if i.startswith("e")] == [in_out_item(n) for n in range(1, IN_OUT + 1)]
    replies = _rows(tmp_path / "client.db", f"SELECT item, reply FROM {REPLY_TABLE} ORDER BY rowid")
    assert sorted(replies) == [(in_out_item(n), "re:" + in_out_item(n)) for n in range(1, IN_OUT + 1)]
    # the loop never ran what blocks (the callbacks' times are printed above: a loaded machine stretches them)
    assert int(loop_line.rsplit("callbacks=", 1)[1].split()[0]) > 0, loop_line
    assert loop_line.endswith(" off_loop_calls=0"), loop_line
