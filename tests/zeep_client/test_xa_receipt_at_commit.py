"""Under XA in one database, a PostgreSQL service's receipt of a request rides on its delivery's COMMIT.

Real parts: a reliable spyne service whose PostgreSQL store lives in its application's database
(the application's row and the store's work in one branch, committed in one phase), a reliable
zeep client over loopback HTTP.  The service runs the application before the request's receipt,
guessing from its last delivery of the sequence that the receipt will take it; the receipt, the
take, the acknowledgement riding on the request and the reply's enqueue then go with the COMMIT,
checked there before it: the service's session sends two query strings a call, the application's
INSERT and the COMMIT's.  A guess found wrong there rolls the whole transaction back, the
application's row too, and the request is received the general way: nothing lost, nothing twice.
Counts, never time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import destination, retransmission
from wsrm_plugin.engine import invoker as invoker_module
from wsrm_plugin.store.postgres import PostgresStore

from . import service
from tests.engine.support import wait_for

from .conftest import fast_policy
from .test_xa_call_path import _LOG_STATEMENTS, QUIET, _sent

pytestmark = pytest.mark.postgres

CALLS = 5
WARM = 5


@dataclasses.dataclass
class Served:
    svc: Any
    rc: Any
    dsn: str
    pids: list[int]


@pytest.fixture
def served(pg_dsn_factory: Any, tmp_path: Any, monkeypatch: Any) -> Iterator[Served]:
    """The service's application inserts each text into ``orders`` through an XA data source on the
    store's own database, in the delivery's global transaction; ``pids`` its sessions, a call each."""
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    monkeypatch.setattr(destination, "HELD_BYTES_REFRESH", 3600.0)  # no budget read in a receipt
    # on a loaded machine an application's average time above QUICK_APPLICATION sends requests
    # through the buffer, by design (its invoker thread then delivers them): each on receipt here
    monkeypatch.setattr(invoker_module, "QUICK_APPLICATION", 60.0)
    dsn = pg_dsn_factory("xarcpt", "CREATE TABLE orders (item text PRIMARY KEY)", _LOG_STATEMENTS)
    tm = TransactionManager(node="xa-receipt", log=tmp_path / "tm.log")
    ds = XADataSource(dsn, tm)
    store = PostgresStore(dsn)
    pids: list[int] = []

    def insert(text: str) -> None:
        with ds.connection() as conn, conn.cursor() as cur:
            pids.append(conn.info.backend_pid)
            cur.execute("INSERT INTO orders VALUES (%s)", (text,))
    service.reset()
    service.ON_ECHO.append(insert)
    service.ON_RECORD.append(insert)
    svc = reliable_service(service.spyne_app(), store, fast_policy(**QUIET), tm=tm)
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "memory:", fast_policy(**QUIET))
    try:
        yield Served(svc, rc, dsn, pids)
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        ds.close()
        store.close()
        tm.close()


def _orders(dsn: str) -> list[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("SELECT item FROM orders ORDER BY item")
            return [item for (item,) in cur.fetchall()]
    finally:
        conn.close()


def test_an_xa_services_receipt_rides_on_its_commit(served: Served, pg_server: Any) -> None:
    """Per call the service's session sends the application's INSERT (its BEGIN in front) and one
    query string with the receipt, the take, the acknowledgement, the reply's enqueue and the
    COMMIT: two round trips (three before: the receipt in one of its own, before the application)."""
    rc, dest = served.rc, served.svc.engine.destination
    # the first opens the sequences, the next goes the general way, the ones after as guessed
    assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(WARM)] == [f"re:q{i}" for i in range(WARM)]
    before = dest.receipts_at_commit
    for i in range(WARM, CALLS + WARM):
        offset = pg_server.log_path.stat().st_size
        assert rc.service.echo(f"q{i}").result(timeout=60) == f"re:q{i}"
        # the delivery's, from its BEGIN to its COMMIT (the pool's session serves other threads
        # before and after), but for its preparations (a session prepares a statement the second
        # time it sends it); without the ride the BEGIN went with the receipt, before the INSERT
        sent = [q for q in _sent(pg_server.log_path, offset, served.pids[-1]) if "wsrm_prepare" not in q]
        began = [n for n, q in enumerate(sent) if q == f"BEGIN;INSERT INTO orders VALUES ('q{i}')"]
        assert began, sent
        sent = sent[began[0]:]
        sent = sent[:next((n for n, q in enumerate(sent) if q.endswith("COMMIT")), len(sent)) + 1]
        assert len(sent) == 2, sent
        # the RMD row's lock, the receipt and take, the acknowledgement's lock and statement, the
        # reply's INSERT and its sequence's number, then the COMMIT
        assert sent[1].endswith(";COMMIT") and sent[1].count(";") == 6, sent
    assert dest.receipts_at_commit - before == CALLS
    assert dest.receipts_declined_at_commit == 0
    assert service.ECHOED == [f"q{i}" for i in range(CALLS + WARM)]
    assert _orders(served.dsn) == sorted(f"q{i}" for i in range(CALLS + WARM))


def test_a_receipt_at_commit_that_guessed_wrong_rolls_back_and_goes_the_general_way(served: Served) -> None:
    """The reply sequence's next number as the service last committed it is made stale (as if
    another process had enqueued on it): the reply's enqueue takes a number already used, the
    receipt's statement finds the row otherwise at the COMMIT and fails on purpose, the
    application's row rolls back with it, and the request is received the general way: the
    application ran twice, its row is there once, every call answered once and in order."""
    rc, dest = served.rc, served.svc.engine.destination
    assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(3)] == ["re:q0", "re:q1", "re:q2"]
    ((identifier, (seq, reply_seq)),) = dest._foreseen.items()
    dest._foreseen[identifier] = (seq, dataclasses.replace(reply_seq, next_number=reply_seq.next_number - 1))
    assert rc.service.echo("q3").result(timeout=60) == "re:q3"
    assert dest.receipts_declined_at_commit == 1
    assert service.ECHOED == ["q0", "q1", "q2", "q3", "q3"]  # its first run rolled back
    before = dest.receipts_at_commit
    assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(4, 7)] == ["re:q4", "re:q5", "re:q6"]
    assert dest.receipts_at_commit - before == 3  # the general way's commit foresaw the next again
    assert _orders(served.dsn) == [f"q{i}" for i in range(7)]


def _record(served: Served, text: str) -> None:
    """A one-way call, and its row committed (nothing answers it)."""
    served.rc.service.record(text)
    assert wait_for(lambda: text in _orders(served.dsn), timeout=60), text


def test_an_xa_services_one_way_receipt_rides_on_its_commit(served: Served, pg_server: Any) -> None:
    """Per one-way message the service's session sends the application's INSERT (its BEGIN in
    front) and one query string with the receipt and take (one statement, which checks itself)
    and the COMMIT: two round trips (three before: the receipt in one of its own, with the BEGIN,
    before the application)."""
    dest = served.svc.engine.destination
    # the first opens the sequence, the next goes the general way, the ones after as guessed
    for i in range(WARM):
        _record(served, f"r{i}")
    before = dest.receipts_at_commit
    for i in range(WARM, CALLS + WARM):
        offset = pg_server.log_path.stat().st_size
        _record(served, f"r{i}")
        sent = [q for q in _sent(pg_server.log_path, offset, served.pids[-1]) if "wsrm_prepare" not in q]
        began = [n for n, q in enumerate(sent) if q == f"BEGIN;INSERT INTO orders VALUES ('r{i}')"]
        assert began, sent
        sent = sent[began[0]:]
        sent = sent[:next((n for n, q in enumerate(sent) if q.endswith("COMMIT")), len(sent)) + 1]
        assert len(sent) == 2, sent
        assert sent[1].endswith(";COMMIT") and sent[1].count(";") == 1, sent
    # the count follows the COMMIT in the service's thread, so a warm-up message's may come after
    # `before` was read (its row was visible first): at least one a call, and each on the wire above
    assert wait_for(lambda: dest.receipts_at_commit - before >= CALLS, timeout=60), \
        (dest.receipts_at_commit, before)
    assert dest.receipts_declined_at_commit == 0
    assert service.RECEIVED == [f"r{i}" for i in range(CALLS + WARM)]
    assert _orders(served.dsn) == sorted(f"r{i}" for i in range(CALLS + WARM))


def _change_after_three(served: Served, sql: str) -> None:
    """Three one-way messages of one sequence delivered, then its rows changed behind the
    service's back by ``sql`` (one row; its one parameter the sequence), as another process
    sharing the store would."""
    for i in range(3):
        _record(served, f"r{i}")
    ((identifier, _),) = served.svc.engine.destination._foreseen.items()
    conn = psycopg2.connect(served.dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, (identifier,))
            assert cur.rowcount == 1
    finally:
        conn.close()


def test_a_one_way_receipt_at_commit_that_guessed_wrong_rolls_back_and_goes_the_general_way(
        served: Served) -> None:
    """The sequence's row is changed behind the service's back (as another process sharing the
    store would: a last message number recorded): the service guesses from its own last
    delivery, the receipt's statement finds the row otherwise at the COMMIT and fails on
    purpose, the application's row rolls back with it, and the message is received the general
    way: the application ran twice, its row is there once, every message delivered once, in
    order; the sequence's next messages go the general way (the row says a last number)."""
    dest = served.svc.engine.destination
    _change_after_three(served, "UPDATE rmd_sequence SET last_number = 1000 WHERE sequence_id = %s")
    _record(served, "r3")
    assert dest.receipts_declined_at_commit == 1
    assert service.RECEIVED == ["r0", "r1", "r2", "r3", "r3"]  # its first run rolled back
    before = dest.receipts_at_commit
    for i in range(4, 7):
        _record(served, f"r{i}")
    assert dest.receipts_at_commit == before
    assert _orders(served.dsn) == [f"r{i}" for i in range(7)]


def test_a_one_way_receipt_at_commit_takes_only_from_exactly_the_prefix_delivered(served: Served) -> None:
    """The take riding on the COMMIT is a plain UPDATE of the invoker's row from exactly
    1..number-1 delivered (``statements._RECEIVE_IN_ORDER_CHECKED``): a row that says the
    prefix delivered and a later number too (changed behind the service's back) is not taken
    from; the receipt fails on purpose, the application's row rolls back with it, and the message
    is received the general way (buffered, then delivered by the invoker): once, in order."""
    dest = served.svc.engine.destination
    _change_after_three(served, "UPDATE invoker_sequence SET delivered = '1-3,1000' WHERE sequence_id = %s "
                        "AND delivered = '1-3' AND delivered_upto = 3")
    declined = dest.receipts_declined_at_commit
    _record(served, "r3")
    assert dest.receipts_declined_at_commit == declined + 1
    assert wait_for(lambda: _orders(served.dsn) == [f"r{i}" for i in range(4)], timeout=30), _orders(served.dsn)
    assert service.RECEIVED.count("r3") == 2  # its first run rolled back


def test_a_sequence_whose_guesses_fail_now_and_then_keeps_receiving_at_the_commit(
        served: Served, monkeypatch: Any) -> None:
    """Three guesses found wrong, each after more guesses that held than forgive one
    (``_FORESIGHT_FORGIVEN``), as a loaded machine's reordered requests make them now and then in
    this process alone: the sequence's receipts still ride on the commit after the third (they
    went the general way for the sequence's life, measured: 0.03-0.89 of a single client's 1,000
    messages at the commit); each declined message is delivered once, in order.  A wrong guess is
    made by a receipt that expects a received prefix the row does not have."""
    from wsrm_plugin.store.sql.transaction import SqlTransaction

    dest = served.svc.engine.destination
    spoil: list[bool] = []
    receive_at_commit = SqlTransaction.receive_at_commit

    def sometimes_wrong(self: SqlTransaction, sequence_id: str, number: int, **kw: Any) -> bool:
        if spoil:
            spoil.pop()
            hold = self._hold_for_receipt
            self._hold_for_receipt = lambda s, n: hold(s, n) + ",999999"  # type: ignore[method-assign]
        return receive_at_commit(self, sequence_id, number, **kw)
    monkeypatch.setattr(SqlTransaction, "receive_at_commit", sometimes_wrong)
    sent = 0
    for _ in range(WARM):
        _record(served, f"r{sent}")
        sent += 1
    for declines in range(1, destination._FORESIGHT_DECLINES + 1):
        spoil.append(True)
        _record(served, f"r{sent}")
        sent += 1
        assert dest.receipts_declined_at_commit == declines
        for _ in range(destination._FORESIGHT_FORGIVEN + 1):  # the general way's, then guesses that hold
            _record(served, f"r{sent}")
            sent += 1
    before = dest.receipts_at_commit
    for _ in range(3):
        _record(served, f"r{sent}")
        sent += 1
    # (>=: the count of the message before them may still be on its way when read)
    assert wait_for(lambda: dest.receipts_at_commit - before >= 3, timeout=60), dest.receipts_at_commit - before
    assert service.RECEIVED == [f"r{i}" for i in range(sent) for _ in range(2 if i in _declined(sent) else 1)]
    assert _orders(served.dsn) == sorted(f"r{i}" for i in range(sent))


def _declined(sent: int) -> set[int]:
    """The numbers (from 0) the test above spoiled: after the warm-up, one in every
    ``_FORESIGHT_FORGIVEN + 2``."""
    step = destination._FORESIGHT_FORGIVEN + 2
    return {WARM + k * step for k in range(destination._FORESIGHT_DECLINES)} & set(range(sent))
