"""The kill runs of ``test_kills*.py``: kill -9 at random instants, client or server peer, again
and again, each restarted on its store.

A supervisor's view of a crash: the process dies with SIGKILL (no cleanup,
no flush) and is started again with the same arguments, on the same store
and port.  Whatever the instant, every message must reach the application
exactly once and in order:

* the server records each hand-over in the same transaction that takes the
  message out of the invoker buffer (``--record-in-store``: its own table in
  the store's database; in the XA test, a PostgreSQL table in one XA
  transaction with the store);
* the client is ``--resume``-d: it enqueues only what the killed one had not
  handed over (see :mod:`tests.engine.peer`), and its RMS worker
  retransmits what was enqueued but not acknowledged.

The XA tests also kill inside two-phase commit (``--die-at-checkpoint``) and
checks, after recovery on restart, the two "both or neither" promises: the
client's ``sent`` row with the enqueue, the server's ``delivered`` row with
the dequeue; and that no prepared branch is left behind.

The tests are in three files (one sequence, 16 sequences, XA), so that the README's test command
runs them on different workers side by side.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from wsrm_plugin.engine.transport import free_port

from .peer import PeerProcess
from .support import wait_for


def store_items(store_url: str, table: str = "app_delivered") -> list[str]:
    """Items of the application's table in a store's database, in commit order of their rows."""
    sql = f"SELECT item FROM {table} ORDER BY id"
    if store_url.startswith("sqlite:///"):
        path = Path(store_url[len("sqlite:///"):])
        if not path.exists():
            return []
        conn = sqlite3.connect(path, timeout=30)
        try:
            return [row[0] for row in conn.execute(sql)]
        except sqlite3.OperationalError:  # not created yet
            return []
        finally:
            conn.close()
    import psycopg2

    dsn = store_url.partition(":")[2] if not store_url.startswith("postgresql://") else store_url
    try:
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(sql)
            return [row[0] for row in cur.fetchall()]
    except psycopg2.Error:
        return []


def store_url(kind: str, name: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/{name}.db"
    return "postgresql:" + request.getfixturevalue("pg_dsn_factory")(name)


@dataclass
class KillRun:
    """Both peers, and the kills done to them."""

    server: PeerProcess
    client: PeerProcess
    rng: random.Random
    kills: dict[str, int] = field(default_factory=lambda: {"server": 0, "client": 0})
    self_kills: dict[str, int] = field(default_factory=lambda: {"server": 0, "client": 0})

    def client_finished(self) -> bool:
        return not self.client.running and self.client.proc.returncode == 0

    def revive(self) -> None:
        """Restart a peer that died on its own (``--die-at-checkpoint``); a failed client too."""
        if not self.server.running:
            self.self_kills["server"] += 1
            self.start_server()
        if not self.client.running and self.client.proc.returncode != 0:
            self.self_kills["client"] += 1
            self.client.start()

    def start_server(self, attempts: int = 10) -> None:
        """Start the server until it is ready: its recovery runs transactions too, and with
        ``--die-at-checkpoint`` it may die at one of them before it says READY (a kill like
        any other, counted as one of its own)."""
        for _ in range(attempts):
            if not self.server.running:
                self.server.start()
            if self.server.wait_line("READY ", timeout=60) is not None:
                return
            if self.server.running or "dying at transaction checkpoint" not in self.server.tail():
                self.server.ready_url(timeout=0)  # raises, saying why it did not start
            self.self_kills["server"] += 1
        raise AssertionError(f"the server died at a checkpoint in each of {attempts} starts")

    def kill_at_random(self) -> None:
        """Wait a random instant after the victim got going, then SIGKILL and restart it."""
        victim = self.rng.choice(("server", "client")) if self.client.running else "server"
        peer = self.server if victim == "server" else self.client
        peer.wait_line("READY " if victim == "server" else "STARTED", timeout=60)
        time.sleep(self.rng.uniform(0.0, 0.6))
        if not peer.running:
            return  # it finished, or died on its own: revive() deals with it
        peer.kill()
        self.kills[victim] += 1
        if victim == "server":
            self.start_server()
        else:
            peer.start()

    def run(self, kills: int, timeout: float = 240.0) -> None:
        """``kills`` random kills, then let the client finish (reviving whoever dies on its own)."""
        while sum(self.kills.values()) < kills:
            self.revive()
            self.kill_at_random()
        deadline = time.monotonic() + timeout
        while not self.client_finished():
            assert time.monotonic() < deadline, f"client did not finish: {self.client.tail()}"
            self.revive()
            time.sleep(0.1)

    def stop(self) -> None:
        for peer in (self.client, self.server):
            peer.kill()

    def describe(self) -> str:
        return (f"kills {self.kills}, self-kills {self.self_kills}\nserver:\n{self.server.tail()}\n"
                f"client:\n{self.client.tail()}")


def start_run(server_args: list[str], client_args: list[str], seed: int) -> KillRun:
    server = PeerProcess("--role", "server", "--port", free_port(), *server_args)
    try:
        url = server.ready_url()
        client = PeerProcess("--role", "client", "--target", url, "--close", "--resume", "--drain-timeout", 120,
                             *client_args)
    except BaseException:
        server.kill()
        raise
    return KillRun(server, client, random.Random(seed))


def finish(run: KillRun, delivered: Callable[[], list[str]], count: int) -> list[str]:
    status = run.client.status()
    assert status is not None and status["drained"] and status["rms_sequences"] == 0, run.describe()
    assert status["faulted_sequences"] == 0

    def all_delivered() -> bool:  # the invoker may still be handing over from its durable buffer
        run.revive()  # and the server may still die at a checkpoint doing so
        return len(delivered()) >= count

    assert wait_for(all_delivered, timeout=60, interval=0.1), \
        f"{len(delivered())} of {count} delivered; {run.describe()}"
    assert run.server.stop() == 0, run.server.tail()
    return delivered()


def kill_run(server_args: list[str], client_args: list[str], *, count: int, kills: int,
             delivered: Callable[[], list[str]]) -> tuple[list[str], str]:
    """Both peers started, ``kills`` random kills, the client finished: (what ``delivered()``
    reads then, the run's seed and kills to name in a failure)."""
    seed = random.SystemRandom().randrange(2**32)
    run = start_run(server_args, client_args, seed)
    try:
        run.run(kills)
        items = finish(run, delivered, count)
    finally:
        run.stop()
    context = f"seed {seed}, {run.describe()}"
    assert sum(run.kills.values()) >= kills, context
    return items, context


def assert_exactly_once_in_order(items: list[str], count: int, context: str) -> None:
    expected = [f"m{i}" for i in range(count)]
    duplicates = sorted({i for i in items if items.count(i) > 1})
    missing = sorted(set(expected) - set(items))
    assert not duplicates and not missing, f"duplicates {duplicates[:10]}, missing {missing[:10]}; {context}"
    assert items == expected, f"out of order; {context}"


def assert_exactly_once_in_order_per_key(items: list[str], count: int, keys: int, context: str) -> None:
    """Every item once; the items of each key (every ``keys``-th) in their order, whatever the
    interleaving of the keys."""
    assert sorted(items, key=lambda i: int(i[1:])) == [f"m{i}" for i in range(count)] and len(items) == count, \
        f"duplicates {sorted({i for i in items if items.count(i) > 1})[:10]}, " \
        f"missing {sorted(set(f'm{i}' for i in range(count)) - set(items))[:10]}; {context}"
    for k in range(keys):
        mine = [i for i in items if int(i[1:]) % keys == k]
        assert mine == [f"m{i}" for i in range(k, count, keys)], f"key {k} out of order; {context}"


def xa_kill_run(tmp_path: Path, server_app: str, client_app: str, server_store: str, client_store: str,
                 *, count: int, kills: int, keys: int = 1, server: tuple[str, ...] = ()) -> None:
    import psycopg2

    def rows(dsn: str, table: str) -> list[str]:
        try:
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute(f"SELECT item FROM {table} ORDER BY id")
                return [row[0] for row in cur.fetchall()]
        except psycopg2.Error:
            return []

    common = ["--safety-interval", "0", "--die-at-checkpoint", "0.004", "--base-interval", "0.1"]
    delivered, context = kill_run(
        ["--store", server_store, "--record-dsn", server_app, "--tm-log", tmp_path / "srv.tmlog",
         "--node", "xa-server", *server, *common],
        ["--store", client_store, "--record-dsn", client_app, "--tm-log", tmp_path / "cli.tmlog",
         "--node", "xa-client", "--count", count, "--keys", keys, *common],
        count=count, kills=kills, delivered=lambda: rows(server_app, "delivered"))
    # the client: each sent row committed with its enqueue (a row without its message would be
    # missing below, a message without its row would be enqueued again on resume: a duplicate)
    if keys > 1:
        assert_exactly_once_in_order_per_key(rows(client_app, "sent"), count, keys, "sent table; " + context)
        assert_exactly_once_in_order_per_key(delivered, count, keys, "delivered table; " + context)
    else:
        assert_exactly_once_in_order(rows(client_app, "sent"), count, "sent table; " + context)
        # the server: each delivered row committed with its dequeue
        assert_exactly_once_in_order(delivered, count, "delivered table; " + context)
    # recovery on restart left no branch in doubt
    for dsn in (server_app, client_app):
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
            assert cur.fetchall() == [], context
    from wsrm_plugin.store import open_store

    for url in (server_store, client_store):
        store = open_store(url)
        try:
            assert store.xa_resource().recover() == [], f"{url}: {context}"
        finally:
            store.close()
