"""A future-only call is answered from the response before its reply is recorded (PostgreSQL).

Real parts: a reliable zeep client on a PostgreSQL store, a reliable spyne service over loopback
HTTP, the reply coming back in the HTTP response.  The reply's record (its receipt, its request
marked answered, the acknowledgement riding on it applied) is made by the records' thread
(``Destination.answer_before_record``, ``wsrm_plugin.engine.later_records``) while the caller
goes on.  Held here at its start: the caller has its answer, the store still shows the request
waiting for its reply; let go, the record comes.  The caller's next claim waits for it (the
request before is acknowledged only then), and an engine's stop records what is left before
the store closes.  Counts and states, never time.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from wsrm_plugin.engine import destination, inbound, retransmission
from wsrm_plugin.store.postgres import PostgresStore

from . import service
from .conftest import fast_policy

pytestmark = pytest.mark.postgres

#: nothing but the caller sends a request (no grace ends, no retransmission is due)
QUIET = dict(caller_send_grace=30.0, base_retransmission_interval=30.0)


@pytest.fixture
def held_records(monkeypatch):
    """The records' jobs wait for ``gate`` before they run; ``started`` counts those that came."""
    gate, started = threading.Event(), []
    record = inbound.Inbound._record_answered

    def held(self: Any, *args: Any) -> None:
        started.append(threading.current_thread().name)
        gate.wait()
        record(self, *args)
    monkeypatch.setattr(inbound.Inbound, "_record_answered", held)
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    # a claim waits for a held record for as long as the test holds it, however loaded the machine
    monkeypatch.setattr(destination, "RECORDS_WAIT", 120.0)
    return gate, started


@pytest.fixture
def served(pg_dsn_factory: Any):
    store = PostgresStore(pg_dsn_factory("early"))
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), store, fast_policy(**QUIET))
    try:
        yield store, rc
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        store.close()


def _waiting_for_replies(store: PostgresStore) -> list[int]:
    """The requests of the client's sequences still waiting for their reply."""
    with store.begin() as tx:
        return [m.number for s in tx.rms.list_all() for m in tx.rms_messages.list_for(s.key) if m.reply_pending]


def test_a_call_is_answered_before_its_replys_record(served, held_records):
    store, rc = served
    gate, started = held_records
    assert rc.service.echo("q0").result(timeout=60) == "re:q0"
    # answered while its record waits in the records' thread (before: the caller's own record
    # committed before the future resolved, and nothing came here)
    assert wait_for(lambda: len(started) == 1)
    assert started == [f"{rc.engine.name}-reply-records"]  # named after its engine, as its other threads
    assert _waiting_for_replies(store) == [1]
    gate.set()
    assert wait_for(lambda: _waiting_for_replies(store) == [])
    assert rc.pending_futures() == 0
    assert rc.engine.status().buffered == 0  # consumed by its record: nothing left to deliver


def test_the_next_claim_waits_for_the_record_before_it(served, held_records):
    store, rc = served
    gate, started = held_records
    gate.set()
    assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(2)] == ["re:q0", "re:q1"]
    assert wait_for(lambda: len(started) == 2)
    gate.clear()
    sent = rc.engine.retransmission.sent_by_callers
    assert rc.service.echo("q2").result(timeout=60) == "re:q2"
    assert wait_for(lambda: len(started) == 3)
    waiting: list[str] = []
    records_done = rc.engine.source.records_done

    def noted() -> None:
        waiting.append(threading.current_thread().name)
        records_done()
    rc.engine.source.records_done = noted
    answered: list[str] = []
    nxt = threading.Thread(target=lambda: answered.append(rc.service.echo("q3").result(timeout=60)), name="q3")
    nxt.start()
    # its claim waits for q2's record (q2 is acknowledged only once its reply is recorded): it
    # did not go out meanwhile
    assert wait_for(lambda: "q3" in waiting)
    assert service.ECHOED == ["q0", "q1", "q2"]
    gate.set()
    nxt.join(60)
    assert answered == ["re:q3"]
    # and its caller's thread sent it, claimed in its enqueue (not left to the sender's round)
    assert rc.engine.retransmission.sent_by_callers - sent == 2
    assert wait_for(lambda: _waiting_for_replies(store) == [])
    assert service.ECHOED == ["q0", "q1", "q2", "q3"]


def test_a_stop_records_the_replies_answered_before_it(pg_dsn_factory: Any, held_records):
    gate, started = held_records
    dsn = pg_dsn_factory("earlystop")
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "postgresql:" + dsn, fast_policy(**QUIET))
    stopping = threading.Thread(target=rc.stop, kwargs={"timeout": 30})
    try:
        assert rc.service.echo("q0").result(timeout=60) == "re:q0"
        assert wait_for(lambda: len(started) == 1)
        stopping.start()
        gate.set()
        stopping.join(60)
        assert not stopping.is_alive()
        # the store (closed by the stop) has the record: the request waits for nothing
        store = PostgresStore(dsn)
        try:
            assert _waiting_for_replies(store) == []
        finally:
            store.close()
    finally:
        gate.set()
        if not stopping.is_alive() and stopping.ident is None:  # (the test failed before it)
            rc.stop(timeout=5)
        svc.stop(timeout=5)


def test_answer_before_record_off_records_the_reply_first(pg_dsn_factory: Any, held_records):
    """``RMPolicy.answer_before_record=False``: the caller records its reply before its answer."""
    gate, started = held_records
    store = PostgresStore(pg_dsn_factory("recordfirst"))
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), store,
                         fast_policy(**QUIET, answer_before_record=False))
    try:
        assert rc.service.echo("q0").result(timeout=60) == "re:q0"
        assert _waiting_for_replies(store) == []  # recorded before the answer
        assert started == []
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        store.close()
