"""Server processes that crash (SIGKILL) or share one PostgreSQL store: exactly once, in order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from tests.engine.support import wait_for
from wsrm_plugin.engine.transport import free_port as _free_port

from . import service
from .conftest import Envelopes, action

ROOT = Path(__file__).resolve().parents[2]


def _rows(dsn: str) -> list[tuple[str, str]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item, node FROM orders ORDER BY id")
            return cur.fetchall()
    finally:
        conn.close()


@pytest.fixture
def orders_db(pg_dsn_factory):
    return pg_dsn_factory("spyneproc", service.SCHEMA)


class ServerProcess:
    """One ``server_process`` child: started, waited for READY, killed or stopped."""

    def __init__(self, **options: object) -> None:
        command = [sys.executable, "-m", "tests.spyne_server.server_process"]
        for name, value in options.items():
            command += [f"--{name.replace('_', '-')}", str(value)]
        self.child = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env={**os.environ})
        line = self.child.stdout.readline()
        if not line.startswith("READY "):
            self.child.kill()
            raise AssertionError(f"server did not start: {line!r} {self.child.stderr.read()}")
        self.url = line.split()[1]

    def kill(self) -> None:
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=30)
        self._close_pipes()

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.stdin.close()
            try:
                self.child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait(timeout=30)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.child.stdin, self.child.stdout, self.child.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


@pytest.fixture
def processes():
    started: list[ServerProcess] = []

    def start(**options: object) -> ServerProcess:
        process = ServerProcess(**options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def test_a_server_killed_mid_run_and_restarted_loses_and_duplicates_nothing(
        processes, clients, orders_db, tmp_path):
    options = dict(store=f"sqlite:///{tmp_path}/server.db", port=_free_port(), dsn=orders_db,
                   node="spyne-crash", tm_log=tmp_path / "tm.log", delay=0.02)
    server = processes(**options)
    client = clients("memory:")
    build = Envelopes(server.url)
    items = [f"item-{i:03d}" for i in range(60)]
    for item in items:
        client.send(server.url, build("record", item), action=action("record"))

    assert wait_for(lambda: len(_rows(orders_db)) >= 10, timeout=60)
    server.kill()
    assert len(_rows(orders_db)) < len(items), "the crash came too late to test anything"
    processes(**options)  # same store, same port, same node and log: recovery, then the rest

    assert wait_for(lambda: len(_rows(orders_db)) >= len(items), timeout=120), len(_rows(orders_db))
    assert wait_for(lambda: client.status().unacked == 0, timeout=60)
    assert [item for item, _ in _rows(orders_db)] == items  # each once, in order


def test_two_server_processes_on_one_postgres_store_deliver_exactly_once_in_order(
        processes, clients, orders_db, pg_dsn_factory, tmp_path):
    store = f"postgresql:{pg_dsn_factory('spynestore')}"
    first = processes(store=store, port=_free_port(), dsn=orders_db, node="spyne-a",
                      tm_log=tmp_path / "a.log", delay=0.01)
    second = processes(store=store, port=_free_port(), dsn=orders_db, node="spyne-b",
                       tm_log=tmp_path / "b.log", delay=0.01)
    client = clients("memory:")
    build = Envelopes(first.url)
    sent: dict[str, list[str]] = {}
    # two sequences received by each process; every invoker may deliver any of them
    for key in ("k1", "k2"):
        for server in (first, second):
            name = f"{key}@{server.child.pid}"
            sent[name] = [f"{name}#{i:02d}" for i in range(15)]
    for i in range(15):
        for key in ("k1", "k2"):
            for server in (first, second):
                name = f"{key}@{server.child.pid}"
                client.send(server.url, build("record", sent[name][i]), action=action("record"), key=key)

    total = sum(len(items) for items in sent.values())
    assert wait_for(lambda: len(_rows(orders_db)) >= total, timeout=120), len(_rows(orders_db))
    assert wait_for(lambda: client.status().unacked == 0, timeout=60)
    rows = _rows(orders_db)
    assert len(rows) == total
    for name, items in sent.items():
        assert [item for item, _ in rows if item.startswith(name + "#")] == items
