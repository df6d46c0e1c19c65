"""Draining a backlog costs each message as much at any backlog (issue 33): the whole send path.

``tests/store/test_backlog.py`` counts the rows the store calls of a round touch (a send batch,
its attempts recorded, an acknowledgement...).  Draining a backlog runs more than those: the
sender's rounds (the claim, the send attempts recorded, the payloads read), the
acknowledgements applied and purged, the acknowledgement and control work of each round.  Here
a client engine, with a backlog queued while its peer was away, drains its first messages to a
real service over loopback HTTP, and the client store's work a message delivered is counted, on
each store: SQLite's virtual machine steps (its progress handler: a proxy for the rows touched)
and its statements; the memory store's rows visited in its index and copied from its tables;
PostgreSQL's tuples of the message table and its indexes read (the server's own counters, as
the store test reads them).  At 20 times the backlog a cost that grew with it would be many
times as high; flat, it is about the same.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.envelopes import prepare_outgoing

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for

SMALL, LARGE = 200, 4000
#: Messages drained and counted at each backlog
COUNTED = 150
#: SQLite's progress handler runs every this many virtual machine steps
STEPS = 50


class _StoreWork:
    """SQLite's virtual machine steps and statements on a store's connections (traced from outside)."""

    def __init__(self, store: Any) -> None:
        self.steps = 0
        self.statements = 0
        self.counting = False
        self._lock = threading.Lock()
        connect = store._connect

        def counted_connect() -> Any:
            conn = connect()
            self._trace(conn)
            return conn
        store._connect = counted_connect
        for conn in list(store._idle):
            self._trace(conn)

    def _trace(self, conn: Any) -> None:
        def step() -> int:
            if self.counting:
                with self._lock:
                    self.steps += STEPS
            return 0

        def statement(sql: str) -> None:
            if self.counting:
                with self._lock:
                    self.statements += 1
        conn.set_progress_handler(step, STEPS)
        conn.set_trace_callback(statement)

    def start(self) -> None:
        self.counting = True

    def stop(self) -> dict[str, float]:
        self.counting = False
        return {"virtual machine steps": self.steps, "statements": self.statements}


class _MemoryWork:
    """The memory store's rows visited in its message index and copied from its tables (as
    ``tests/store/test_backlog.py`` counts them)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.copied = 0
        self._visited = 0
        self.counting = False

        def counted(fn: Callable[..., dict[Any, Any]]) -> Callable[..., dict[Any, Any]]:
            def wrapper(*args: Any) -> dict[Any, Any]:
                rows = fn(*args)
                if self.counting:
                    self.copied += len(rows)
                return rows
            return wrapper
        store._snapshot, store._snapshot_group = counted(store._snapshot), counted(store._snapshot_group)

    def start(self) -> None:
        self._visited = self._store._messages.rows_visited
        self.counting = True

    def stop(self) -> dict[str, float]:
        self.counting = False
        return {"rows visited and copied": self._store._messages.rows_visited - self._visited + self.copied}


class _PostgresWork:
    """Tuples of the message table and its indexes read in the client's database: the server's
    counters, which a session reports when idle (at most a second later) or as it ends, so
    they are read once the engine has stopped and closed its sessions."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._before = 0

    def _tuples_read(self) -> int:
        conn = psycopg2.connect(self.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT pg_stat_clear_snapshot(), sum(pg_stat_get_tuples_returned(c.oid) + "
                            "pg_stat_get_tuples_fetched(c.oid)) FROM pg_class c "
                            "WHERE c.oid = 'rms_message'::regclass OR c.oid IN "
                            "(SELECT indexrelid FROM pg_index WHERE indrelid = 'rms_message'::regclass)")
                return int(cur.fetchone()[1] or 0)
        finally:
            conn.close()

    def start(self) -> None:
        time.sleep(1.1)  # the fill's reads reported
        self._before = self._tuples_read()

    def stop(self) -> dict[str, float]:
        time.sleep(0.5)  # the engine's sessions ended: their last counts reported
        return {"message tuples read": self._tuples_read() - self._before}


def _drain(store_url: str, engines: Callable[..., ReliableEngine], queued: int, **policy: Any) -> dict[str, float]:
    """The client store's work a message (by what its kind counts), over its first COUNTED or
    so deliveries of a backlog of ``queued`` messages."""
    recorder = Recorder()
    server = engines("memory:", fast_policy(), serve=True, application=recorder)
    client = ReliableEngine(store_url, fast_policy(**policy), name="client")
    stopped = False
    try:
        target = server.endpoint_address
        addressing = client.policy.addressing
        with client.store.begin() as tx:  # the backlog, queued while the peer was away
            for i in range(queued):
                outgoing = prepare_outgoing(payload(f"m{i}"), to=target, action=ACTION, message_id=None,
                                            reply_to=None, relates_to=None, wsa=addressing,
                                            max_size=client.policy.max_message_size)
                client.source._enqueue_outgoing(tx, (target, "backlog", False), outgoing)
        kind = store_url.partition(":")[0]
        work = (_StoreWork(client.store) if kind == "sqlite" else _MemoryWork(client.store) if kind == "memory"
                else _PostgresWork(store_url.partition(":")[2]))
        work.start()
        client.start()
        assert wait_for(lambda: len(recorder.snapshot()) >= COUNTED, timeout=60)
        if isinstance(work, _PostgresWork):  # its counts are read from sessions that ended
            client.stop(timeout=5)
            stopped = True
        counts = work.stop()
        delivered = len(recorder.snapshot())
        return {what: n / delivered for what, n in counts.items()}
    finally:
        if not stopped:
            client.stop(timeout=5)


@pytest.mark.parametrize("kind", ["sqlite", "memory", pytest.param("postgresql", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("policy", [{}, {"max_unacknowledged": 16}], ids=["default", "window"])
def test_draining_a_backlog_touches_as_many_rows_a_message_at_any_backlog(
        tmp_path: Path, engines: Callable[..., ReliableEngine], request: pytest.FixtureRequest,
        kind: str, policy: dict[str, Any]) -> None:
    def url(queued: int) -> str:
        if kind == "sqlite":
            return f"sqlite:///{tmp_path}/client-{queued}.db"
        if kind == "memory":
            return "memory:"
        return "postgresql:" + request.getfixturevalue("pg_dsn_factory")("drain")
    small = _drain(url(SMALL), engines, SMALL, **policy)
    large = _drain(url(LARGE), engines, LARGE, **policy)
    for what, at_small in small.items():
        # 20 times the backlog: a cost that grew with it would be several times as high
        assert large[what] <= 1.5 * at_small + 20, (
            f"draining a backlog: {at_small:.0f} {what} a message at {SMALL} queued, {large[what]:.0f} at {LARGE}")
