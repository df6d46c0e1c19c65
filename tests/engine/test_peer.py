"""Engines in separate processes (tests/engine/peer.py): clean runs and a server killed with -9."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from wsrm_plugin.engine.transport import free_port

from .conftest import fast_policy
from .support import ACTION, payload, wait_for

ROOT = Path(__file__).resolve().parents[2]


class Peer:
    """A peer process; its stdout lines are collected by a thread so the pipe never fills."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.engine.peer", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.errors: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.errors), daemon=True).start()

    @staticmethod
    def _pump(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def ready_url(self, timeout: float = 60.0) -> str:
        assert wait_for(lambda: any(l.startswith("READY ") for l in self.lines) or self.proc.poll() is not None,
                        timeout=timeout), "peer did not start"
        ready = [l for l in self.lines if l.startswith("READY ")]
        assert ready, f"peer exited with {self.proc.returncode}: {self.errors[-20:]}"
        return ready[0].split(" ", 1)[1]

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def peers():
    started: list[Peer] = []

    def start(*args: str) -> Peer:
        peer = Peer(*args)
        started.append(peer)
        return peer

    yield start
    for peer in started:
        if peer.proc.poll() is None:
            peer.kill()


def delivered_items(log_path: Path) -> list[str]:
    if not log_path.exists():
        return []
    conn = sqlite3.connect(log_path)
    try:
        return [row[0] for row in conn.execute("SELECT item FROM delivered ORDER BY id")]
    except sqlite3.OperationalError:  # table not created yet
        return []
    finally:
        conn.close()


def test_in_process_client_to_a_server_process(peers, engines, store_for, tmp_path):
    log_path = tmp_path / "delivered.db"
    server = peers("--role", "server", "--store", f"sqlite:///{tmp_path}/server.db", "--log", str(log_path))
    url = server.ready_url()
    client = engines(store_for("memory", "client"))
    for i in range(50):
        client.send(url, payload(f"m{i}"), action=ACTION)
    client.close(url)
    assert wait_for(lambda: not client.store.status().rms, timeout=60), client.status()
    assert wait_for(lambda: len(delivered_items(log_path)) == 50)
    assert server.stop() == 0
    assert delivered_items(log_path) == [f"m{i}" for i in range(50)]


def test_client_process_to_server_process(peers, tmp_path):
    log_path = tmp_path / "delivered.db"
    server = peers("--role", "server", "--rm", "1.0", "--store", f"sqlite:///{tmp_path}/server.db",
                   "--log", str(log_path))
    url = server.ready_url()
    client = peers("--role", "client", "--rm", "1.0", "--store", f"sqlite:///{tmp_path}/client.db",
                   "--target", url, "--count", "30", "--close")
    assert client.proc.wait(90) == 0, client.errors[-20:]
    status = json.loads(client.lines[-1])
    assert status["drained"] and status["rms_sequences"] == 0 and status["faulted_sequences"] == 0
    assert wait_for(lambda: len(delivered_items(log_path)) == 30)
    assert server.stop() == 0
    assert delivered_items(log_path) == [f"m{i}" for i in range(30)]


def test_server_killed_with_sigkill_loses_nothing(peers, engines, store_for, tmp_path):
    """The durable RMD and the client's retransmissions carry everything across kill -9.

    The delivery log here is a separate SQLite file, committed before the
    store's delivery transaction: a kill between the two can repeat one
    delivery (exactly-once across crashes needs the XA mode, tested below).
    """
    log_path = tmp_path / "delivered.db"
    port = str(free_port())
    args = ("--role", "server", "--store", f"sqlite:///{tmp_path}/server.db", "--log", str(log_path),
            "--port", port)
    server = peers(*args)
    url = server.ready_url()
    client = engines(store_for("sqlite", "client"), fast_policy(base_retransmission_interval=0.1))
    for i in range(200):
        client.send(url, payload(f"m{i}"), action=ACTION)
    client.close(url)
    assert wait_for(lambda: len(delivered_items(log_path)) >= 20)
    server.kill()
    restarted = peers(*args)
    assert restarted.ready_url() == url
    assert wait_for(lambda: not client.store.status().rms, timeout=90), client.status()
    # acknowledged means stored: the invoker may still be delivering from the durable buffer
    assert wait_for(lambda: len(set(delivered_items(log_path))) == 200, timeout=60), len(delivered_items(log_path))
    assert restarted.stop() == 0
    items = delivered_items(log_path)
    first_seen = list(dict.fromkeys(items))
    assert first_seen == [f"m{i}" for i in range(200)]
    assert len(items) - len(first_seen) <= 1


@pytest.mark.postgres
def test_server_killed_with_sigkill_delivers_exactly_once_with_xa(peers, engines, store_for, tmp_path,
                                                                   pg_dsn_factory):
    import psycopg2

    dsn = pg_dsn_factory("peer")
    port = str(free_port())
    args = ("--role", "server", "--store", f"sqlite:///{tmp_path}/server.db", "--record-dsn", dsn,
            "--tm-log", str(tmp_path / "tm.log"), "--node", "peer-server", "--port", port,
            "--safety-interval", "0")

    def items() -> list[str]:
        try:
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute("SELECT item FROM delivered ORDER BY id")
                return [row[0] for row in cur.fetchall()]
        except psycopg2.Error:
            return []

    server = peers(*args)
    url = server.ready_url()
    client = engines(store_for("sqlite", "client"), fast_policy(base_retransmission_interval=0.1))
    for i in range(100):
        client.send(url, payload(f"m{i}"), action=ACTION)
    client.close(url)
    assert wait_for(lambda: len(items()) >= 20, timeout=60)
    server.kill()
    restarted = peers(*args)
    restarted.ready_url()
    assert wait_for(lambda: not client.store.status().rms, timeout=120), client.status()
    assert wait_for(lambda: len(items()) >= 100, timeout=60)
    assert restarted.stop() == 0
    assert items() == [f"m{i}" for i in range(100)]
    assert os.path.exists(tmp_path / "tm.log")
