"""Every XA request-reply call is finished by wake-ups alone: none waits for a worker's poll.

Real parts, as ``bench/bench_call_path.py --store xa1`` runs them: a reliable zeep client whose
PostgreSQL store lives in the application's database (the caller's business row and the enqueue
in one global transaction, the request claimed by the statement that enqueues it), a reliable
spyne service on a PostgreSQL store of its own under its own transaction manager, loopback HTTP.
Both sides poll every 60 s and retransmit after 60 s: a call that waited for a poll or a
retransmission would take a minute, so each call must end well before one (every hand-over on
its path -- the commit that frees the caller's lane, the request left to the sender, the
service's delivery and reply, the reply's record -- wakes whoever is next).  A 30-s stall of
this kind was seen under load on this path; this test fails on any such lost wake-up.

About 10-25 s (25 calls); the deadline only bounds a hang.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import retransmission

from . import service
from .conftest import fast_policy

pytestmark = pytest.mark.postgres

CALLS = 25
#: Only a wake-up can move a call on: the workers' polls and the retransmissions come after a minute.
NO_POLL = dict(poll_interval=60.0, base_retransmission_interval=60.0)
#: Well under the poll: a call answered later than this waited for something nobody woke.
WOKEN_WITHIN = 20.0


@pytest.fixture
def xa_both_sides(pg_dsn_factory: Any, tmp_path: Any):
    client_dsn = pg_dsn_factory("xawake", "CREATE TABLE orders (item text PRIMARY KEY)")
    service_dsn = pg_dsn_factory("xawakesvc")
    client_tm = TransactionManager(node="xa-wake-client", log=tmp_path / "client.tmlog")
    service_tm = TransactionManager(node="xa-wake-service", log=tmp_path / "service.tmlog")
    ds = XADataSource(client_dsn, client_tm)
    service.reset()
    svc = reliable_service(service.spyne_app(), "postgresql:" + service_dsn, fast_policy(**NO_POLL),
                           tm=service_tm)
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "postgresql:" + client_dsn, fast_policy(**NO_POLL),
                         tm=client_tm)
    try:
        yield client_tm, ds, rc
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        ds.close()
        client_tm.close()
        service_tm.close()


def test_sequential_xa_calls_each_end_without_waiting_for_a_poll(xa_both_sides, monkeypatch):
    tm, ds, rc = xa_both_sides
    claimed_by_enqueue = []
    claimed = retransmission._EarlyClaim.claimed

    def counting(self: Any, msg: Any, *args: Any) -> None:
        claimed_by_enqueue.append(msg is not None)
        claimed(self, msg, *args)
    monkeypatch.setattr(retransmission._EarlyClaim, "claimed", counting)
    slow: list[tuple[int, float]] = []
    for i in range(CALLS):
        started = time.monotonic()
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO orders VALUES (%s)", (f"q{i}",))
            future = rc.service.echo(f"q{i}")
        # a timeout past the engine's longest send: the caller still sends its request itself
        assert future.result(timeout=3 * WOKEN_WITHIN) == f"re:q{i}"
        took = time.monotonic() - started
        if took > WOKEN_WITHIN:
            slow.append((i, round(took, 1)))
    assert slow == [], f"calls answered only after a poll or a retransmission (call, seconds): {slow}"
    assert service.ECHOED == [f"q{i}" for i in range(CALLS)]
    # most requests were claimed by the statement that enqueued them (the path under test)
    assert claimed_by_enqueue.count(True) >= CALLS // 2, claimed_by_enqueue
