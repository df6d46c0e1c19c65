"""What a request-reply call inside an XA transaction costs the client's store, counted.

Real parts: a reliable zeep client whose PostgreSQL store lives in the application's database
(one branch, committed in one phase with the application's row), a reliable spyne service over
loopback HTTP.  The caller's transaction enqueues the request and claims it for the caller's own
send (its first attempt recorded: no transaction of its own after the commit); the lane is the
caller's only once that commits.  The caller has no store transaction of its own: its call is
answered from the response, and the reply's record follows in the records' thread
(``Destination.answer_before_record``), returning before its WAL flush (the next call's enqueue
covers it).  A rolled-back
call leaves nothing claimed and the next one goes as usual.  The reply's record is one round trip,
which commits it too; a PostgreSQL service's receipt of a request, with the acknowledgement riding on
it, is one round trip before the reply's; under XA the reply's enqueue rides on the service's
COMMIT.  Counts, never time (a few seconds).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import psycopg2
import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import destination, retransmission
from wsrm_plugin.engine import invoker as invoker_module
from wsrm_plugin.store.postgres import PostgresStore
from wsrm_plugin.store.sql import SqlTransaction

from . import service
from .conftest import fast_policy

pytestmark = pytest.mark.postgres

CALLS = 6
#: the thread that records the replies answered before their record (wsrm_plugin.engine.later_records),
#: named after its engine (the reliable client's: ``wsrm-client-<name>``)
RECORDS = "wsrm-client-default-reply-records"
#: nothing but the caller sends a request (no grace ends, no retransmission is due)
QUIET = dict(caller_send_grace=30.0, base_retransmission_interval=30.0)


class Boom(Exception):
    pass


@pytest.fixture(autouse=True)
def steady_counts(monkeypatch):
    """What a loaded machine would change in the counted paths, held still.

    A receipt asks the store for the bytes held once a second (``HELD_BYTES_REFRESH``): a
    statement more in whichever receipt comes after that second, which a loaded machine's calls
    reach (a record counted 2 round trips so in one run at load 7).  Counted here: asked at the
    first receipt only."""
    monkeypatch.setattr(destination, "HELD_BYTES_REFRESH", 3600.0)
    # on a loaded machine an application's average time above QUICK_APPLICATION sends requests
    # through the buffer, by design (its invoker thread delivers them, in more round trips: a
    # receipt counted 5 at load 33): each on receipt here
    monkeypatch.setattr(invoker_module, "QUICK_APPLICATION", 60.0)
    # a caller's claim waits for the reply's record before it, however long a loaded machine
    # keeps the records' thread (after RECORDS_WAIT it would claim in a transaction of its own)
    monkeypatch.setattr(destination, "RECORDS_WAIT", 120.0)


#: every statement the server receives in this test's database goes to its log (each query string,
#: as one "statement:" line, before it runs): what the caller's sessions SENT, per round trip
_LOG_STATEMENTS = ("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET log_statement = %L', "
                   "current_database(), 'all'); END $$")


@pytest.fixture
def one_database(pg_dsn_factory: Any, tmp_path: Any):
    dsn = pg_dsn_factory("xacall", "CREATE TABLE orders (item text PRIMARY KEY)", _LOG_STATEMENTS)
    tm = TransactionManager(node="xa-call", log=tmp_path / "tm.log")
    ds = XADataSource(dsn, tm)
    store = PostgresStore(dsn)
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), store, fast_policy(**QUIET), tm=tm)
    try:
        yield tm, ds, store, rc
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        ds.close()
        tm.close()


def _call(tm: TransactionManager, ds: XADataSource, rc: Any, text: str) -> Any:
    with tm.transaction():
        with ds.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO orders VALUES (%s)", (text,))
        future = rc.service.echo(text)
    return future.result(timeout=60)


def test_an_xa_call_claims_its_request_in_its_transaction_and_records_its_reply_without_a_flush(
        one_database, monkeypatch):
    tm, ds, store, rc = one_database
    # every reply's acknowledgement rides on the next request, however slow a loaded machine is
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    assert [_call(tm, ds, rc, f"q{i}") for i in range(2)] == ["re:q0", "re:q1"]
    rc.engine.destination.wait_records()  # (the last reply's record, before the counting)
    caller = threading.current_thread().name
    # the caller's and the records' thread's store transactions: (committed in their own round
    # trip, returned before their flush)
    ended: dict[str, list[tuple[bool, bool]]] = {caller: [], RECORDS: []}
    finish = store._finish

    def counting(tx: Any, commit: bool) -> None:
        name = threading.current_thread().name
        seen = (tx.committed_alone and not tx.begun, tx.returns_before_disk)
        finish(tx, commit)
        if name in ended:  # (once committed: the test waits for it)
            ended[name].append(seen)
    store._finish = counting
    sent = rc.engine.retransmission.sent_by_callers
    for i in range(2, CALLS + 2):
        assert _call(tm, ds, rc, f"q{i}") == f"re:q{i}"
    # the caller's thread sent each request itself, with no claim transaction of its own (2 per
    # call before: the claim, then the reply's record), and no record either (1 per call before
    # the call was answered ahead of its record); the record commits in its one round trip and
    # does not wait for the WAL
    assert rc.engine.retransmission.sent_by_callers - sent == CALLS
    assert wait_for(lambda: len(ended[RECORDS]) >= CALLS), ended
    assert ended[RECORDS] == [(True, True)] * CALLS, ended
    # and no read of its own either: the acknowledgement of the replies each request carries
    # was read by its claim, in the caller's transaction (a read after the commit before)
    assert ended[caller] == [], ended
    assert service.ECHOED == [f"q{i}" for i in range(CALLS + 2)]


def test_a_rolled_back_xa_call_leaves_nothing_claimed(one_database):
    tm, ds, store, rc = one_database
    assert _call(tm, ds, rc, "first") == "re:first"
    with pytest.raises(Boom):
        with tm.transaction():
            future = rc.service.echo("rolled-back")
            raise Boom()
    with pytest.raises(Exception, match="rolled back"):
        future.result(timeout=5)
    assert rc.engine.retransmission.lane_of(next(iter(rc.engine.source._current.values()))).idle
    assert _call(tm, ds, rc, "second") == "re:second"  # its caller sends it at once, not the sender after the grace
    assert wait_for(lambda: service.ECHOED == ["first", "second"])
    assert rc.engine.store.status().unacked <= 1


def test_an_xa_calls_reply_is_recorded_and_committed_in_one_round_trip(one_database, monkeypatch):
    """The reply's record: the reply received and taken, its request marked answered and the
    acknowledgement riding on the reply applied, in one round trip (two before: the receipt,
    then the mark), which commits it too (a COMMIT of its own before: two round trips).  The
    request is done: nothing of it is sent again."""
    tm, ds, store, rc = one_database
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    assert [_call(tm, ds, rc, f"q{i}") for i in range(2)] == ["re:q0", "re:q1"]
    rc.engine.destination.wait_records()  # (the last reply's record, before the counting)
    trips: dict[int, int] = {}  # the records' store transactions: id -> round trips before the COMMIT
    recorded: list[tuple[int, bool]] = []  # (round trips, a COMMIT sent after them)
    execute = SqlTransaction.execute

    def counted(tx: Any, sql: str, params: Any = (), **kw: Any) -> Any:
        if threading.current_thread().name == RECORDS:
            trips[id(tx)] = trips.get(id(tx), 0) + 1
        return execute(tx, sql, params, **kw)
    monkeypatch.setattr(SqlTransaction, "execute", counted)
    finish = store._finish

    def ending(tx: Any, commit: bool) -> None:
        seen = (trips.pop(id(tx), 0), tx.begun)
        finish(tx, commit)
        if threading.current_thread().name == RECORDS:  # (once committed: the test waits for it)
            recorded.append(seen)
    store._finish = ending
    for i in range(2, CALLS + 2):
        assert _call(tm, ds, rc, f"q{i}") == f"re:q{i}"
    assert wait_for(lambda: len(recorded) >= CALLS), recorded
    assert recorded == [(1, False)] * CALLS, recorded
    assert service.ECHOED == [f"q{i}" for i in range(CALLS + 2)]
    with store.begin() as tx:  # every request answered: none waits for its reply
        key = next(iter(rc.engine.source._current.values()))
        assert not any(m.reply_pending for m in tx.rms_messages.list_for(key))


def test_a_reply_sequence_whose_records_cannot_commit_alone_goes_the_old_way_after_the_first(
        one_database, monkeypatch):
    """A reply sequence whose AcksTo takes acknowledgement requests (here the service's address): its
    record may write one after the receipt, so the round trip that would commit it declines
    (nothing of it written) and the record goes again with a COMMIT of its own.  The destination
    remembers that: the records after it go that way at once (each tried, and declined, a round
    trip more, without the memory)."""
    tm, ds, store, rc = one_database
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    assert [_call(tm, ds, rc, f"q{i}") for i in range(2)] == ["re:q0", "re:q1"]
    rc.engine.destination.wait_records()  # (the last reply's record, before the counting)
    with store.begin() as tx:
        (offered,) = [s.sequence_id for s in tx.rmd.list_all()]
        (target,) = [s.target for s in tx.rms.list_all()]
    conn = psycopg2.connect(store.dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("UPDATE rmd_sequence SET acks_to = %s WHERE sequence_id = %s", (target, offered))
    finally:
        conn.close()
    tried: list[int] = []  # the records' round trips that would have committed alone, and declined
    committed: list[bool] = []  # the records' store transactions: committed by a COMMIT of their own
    execute = SqlTransaction.execute

    def counted(tx: Any, sql: str, params: Any = (), **kw: Any) -> Any:
        cur = execute(tx, sql, params, **kw)
        if threading.current_thread().name == RECORDS and kw.get("declined") and cur is None:
            tried.append(id(tx))
        return cur
    monkeypatch.setattr(SqlTransaction, "execute", counted)
    finish = store._finish

    def ending(tx: Any, commit: bool) -> None:
        begun = tx.begun
        finish(tx, commit)
        if threading.current_thread().name == RECORDS:  # (once committed: the test waits for it)
            committed.append(begun)
    store._finish = ending
    for i in range(2, CALLS + 2):
        assert _call(tm, ds, rc, f"q{i}") == f"re:q{i}"
    assert wait_for(lambda: len(committed) >= CALLS), committed
    assert len(tried) == 1 and committed == [True] * CALLS, (tried, committed)
    assert service.ECHOED == [f"q{i}" for i in range(CALLS + 2)]


def test_a_postgresql_service_receives_a_request_and_its_riding_acknowledgement_in_one_round_trip(
        pg_dsn_factory: Any, monkeypatch):
    """The service's receipt of a request: the request received and taken, and the acknowledgement
    riding on it (of the client's earlier replies) applied, in one round trip (two before), then
    the reply taken for the HTTP response in a second, then the COMMIT."""
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    store = PostgresStore(pg_dsn_factory("svcpath"))
    service.reset()
    svc = reliable_service(service.spyne_app(), store, fast_policy(**QUIET))
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "memory:", fast_policy(**QUIET))
    try:
        assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(2)] == ["re:q0", "re:q1"]
        trips: dict[int, int] = {}  # the service's receiving transactions: id -> round trips before the COMMIT
        receipts: list[int] = []
        execute = SqlTransaction.execute

        def counted(tx: Any, sql: str, params: Any = (), **kw: Any) -> Any:
            if threading.current_thread().name.startswith("waitress"):
                trips[id(tx)] = trips.get(id(tx), 0) + 1
            return execute(tx, sql, params, **kw)
        monkeypatch.setattr(SqlTransaction, "execute", counted)
        finish = store._finish

        def ending(tx: Any, commit: bool) -> None:
            # popped for every transaction: a later one may be given the same id
            counted_trips = trips.pop(id(tx), 0)
            if threading.current_thread().name.startswith("waitress") and tx.begun:
                receipts.append(counted_trips)
            finish(tx, commit)
        store._finish = ending
        for i in range(2, CALLS + 2):
            assert rc.service.echo(f"q{i}").result(timeout=60) == f"re:q{i}"
        assert receipts == [2] * CALLS, receipts
        assert service.ECHOED == [f"q{i}" for i in range(CALLS + 2)]
        assert wait_for(lambda: store.status().unacked <= 1)  # the riding acknowledgements freed the replies
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        store.close()


def test_an_xa_services_reply_rides_on_its_commit(pg_dsn_factory: Any, tmp_path: Any, monkeypatch):
    """A PostgreSQL service under XA whose application writes nothing to its database: its
    delivery's global transaction is one round trip, then the COMMIT.  The first two calls: the
    request's receipt (with the acknowledgement riding on it: the reply sequence's row locked),
    then the COMMIT, which carries the reply's enqueue, numbered from the row held
    (LazyBeginConnection.ride): 2 statements ride.  Once the receipt rides on the COMMIT
    (test_xa_receipt_at_commit): the reply's enqueue (its UPDATE ... INSERT), then the COMMIT,
    which carries the receipt's 4 statements.  Two round trips before the COMMIT without either
    (the receipt, the enqueue)."""
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    tm = TransactionManager(node="xa-service", log=tmp_path / "svc.log")
    store = PostgresStore(pg_dsn_factory("xasvc"))
    service.reset()
    svc = reliable_service(service.spyne_app(), store, fast_policy(**QUIET), tm=tm)
    svc.serve()
    svc.start()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), "memory:", fast_policy(**QUIET))
    try:
        assert [rc.service.echo(f"q{i}").result(timeout=60) for i in range(2)] == ["re:q0", "re:q1"]
        trips: dict[str, int] = {}  # a service thread's store statements since its last commit
        commits: list[tuple[int, int]] = []  # (round trips before the COMMIT, statements riding on it)
        execute = SqlTransaction.execute

        def counted(tx: Any, sql: str, params: Any = (), **kw: Any) -> Any:
            name = threading.current_thread().name
            if name.startswith("waitress"):
                trips[name] = trips.get(name, 0) + 1
            return execute(tx, sql, params, **kw)
        monkeypatch.setattr(SqlTransaction, "execute", counted)
        from txmanager.postgres import PostgresXAResource

        fused: list[bool] = []  # each service COMMIT's fused one-phase path taken (the ride's)

        def committing(real: Any, fuses: bool = False) -> Any:
            def commit(resource: Any, *args: Any, **kw: Any) -> Any:
                name = threading.current_thread().name
                if name.startswith("waitress") and name in trips:
                    commits.append((trips.pop(name), resource.connection.riding))
                    if fuses:
                        done = real(resource, *args, **kw)
                        fused.append(done)
                        return done
                return real(resource, *args, **kw)
            return commit
        monkeypatch.setattr(PostgresXAResource, "end_and_commit_one_phase",
                            committing(PostgresXAResource.end_and_commit_one_phase, fuses=True))
        monkeypatch.setattr(PostgresXAResource, "commit", committing(PostgresXAResource.commit))
        for i in range(2, CALLS + 2):
            assert rc.service.echo(f"q{i}").result(timeout=60) == f"re:q{i}"
        assert commits == [(1, 4)] * CALLS, commits
        # and it went on the fused path: a sole branch named before its commit (the destination
        # asking whether deliveries commit in two phases) declined it, and its COMMIT, with what
        # rode on it, went in a round trip more
        assert fused == [True] * CALLS, fused
        assert service.ECHOED == [f"q{i}" for i in range(CALLS + 2)]
        with store.begin() as tx:  # every reply numbered in its turn, none lost
            (key,) = [s.key for s in tx.rms.list_all()]
            numbers = [m.number for m in tx.rms_messages.list_for(key)]  # those not acknowledged yet
            assert numbers == list(range(CALLS + 3 - len(numbers), CALLS + 3))
            assert tx.rms.get(key).highest_number == CALLS + 2
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        store.close()
        tm.close()


#: the start of an entry of the server's log (``log_line_prefix`` ``%m [%p] ``): a line that is
#: none goes on the entry before it (a query string's later lines: a payload sent as its text)
_LOG_ENTRY = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \S+ \[\d+\] ")


def _sent(log_path: Any, offset: int, pid: int) -> list[str]:
    """The query strings session ``pid`` sent since ``offset`` of the server's log, one a round trip."""
    marker = f"[{pid}] LOG:  statement: "
    with open(log_path, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    sent: list[str] = []
    mine = False
    for line in text.splitlines():
        if _LOG_ENTRY.match(line):
            mine = marker in line
            if mine:
                sent.append(line.split(marker, 1)[1])
        elif mine:
            sent[-1] += "\n" + line
    return sent


def test_an_xa_calls_enqueue_rides_on_its_commit(one_database, pg_server, monkeypatch):
    """The caller's XA session, as the server received it: per call, the application's INSERT
    (its BEGIN in front) and one query string with the request's enqueue and claim, the COMMIT
    and the read of the request's number after it: two round trips (three before: the enqueue in
    one of its own).  The caller still sends its request itself, once its transaction committed."""
    tm, ds, store, rc = one_database
    monkeypatch.setattr(retransmission, "_REPLY_ACK_WAIT", 60.0)
    # the first opens the sequence; the store prepares a statement the second time it sends it
    assert [_call(tm, ds, rc, f"q{i}") for i in range(3)] == ["re:q0", "re:q1", "re:q2"]
    sent_by_callers = rc.engine.retransmission.sent_by_callers
    for i in range(3, CALLS + 3):
        offset = pg_server.log_path.stat().st_size
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                pid = conn.info.backend_pid
                cur.execute("INSERT INTO orders VALUES (%s)", (f"q{i}",))
            future = rc.service.echo(f"q{i}")
        sent = _sent(pg_server.log_path, offset, pid)
        assert len(sent) == 2, sent
        assert sent[0].startswith("BEGIN;INSERT INTO orders"), sent
        # the enqueue in its savepoint (a prepared statement's EXECUTE by now, planned once a session:
        # rms._PLANNED_ONCE, with no sequential scan: rms._ENQUEUES_AT_COMMIT), the COMMIT, the read
        # of the session setting the enqueue wrote its outcome in (no table)
        # (no RELEASE SAVEPOINT: the COMMIT ends the savepoint)
        enqueue, read = sent[1].split(";COMMIT;")
        rider = ("SAVEPOINT txmanager_rider;SET LOCAL plan_cache_mode TO force_generic_plan; "
                 "SET LOCAL enable_seqscan TO off; EXECUTE ")
        # one statement: no ";" but in its arguments' literals (a payload as its text)
        assert enqueue.startswith(rider) and ";" not in re.sub(r"'(?:[^']|'')*'", "", enqueue[len(rider):]), sent
        assert read == "SHOW wsrm.enqueued", sent
        assert future.result(timeout=60) == f"re:q{i}"
    assert rc.engine.retransmission.sent_by_callers - sent_by_callers == CALLS
    assert service.ECHOED == [f"q{i}" for i in range(CALLS + 3)]


def test_an_xa_calls_enqueue_whose_sequence_closed_before_its_commit_goes_on_a_new_sequence(
        one_database, pg_server):
    """The sequence the request's enqueue rides to takes no more messages when the COMMIT comes
    (here its last message is marked by another session meanwhile): the enqueue declines in the
    COMMIT's round trip (nothing of it stays), the request is enqueued on a new sequence in the
    same transaction, which then commits; the call is answered, once, and the application's row
    is there."""
    tm, ds, store, rc = one_database
    assert [_call(tm, ds, rc, f"q{i}") for i in range(3)] == ["re:q0", "re:q1", "re:q2"]
    (old_key,) = set(rc.engine.source._current.values())
    offset = pg_server.log_path.stat().st_size
    with tm.transaction():
        with ds.connection() as conn, conn.cursor() as cur:
            pid = conn.info.backend_pid
            cur.execute("INSERT INTO orders VALUES ('late')")
        future = rc.service.echo("late")
        other = psycopg2.connect(store.dsn)
        try:
            with other, other.cursor() as cur:
                cur.execute("UPDATE rms_sequence SET last_message = TRUE, last_number = highest_number "
                            "WHERE seq_key = %s", (old_key,))
        finally:
            other.close()
    sent = _sent(pg_server.log_path, offset, pid)
    assert sent[1].startswith("SAVEPOINT txmanager_rider;") and ";COMMIT;" in sent[1], sent  # declined there
    assert sent[2].startswith("ROLLBACK TO SAVEPOINT txmanager_rider;"), sent  # then done the old way
    assert future.result(timeout=60) == "re:late"
    assert service.ECHOED == ["q0", "q1", "q2", "late"]
    assert old_key not in set(rc.engine.source._current.values())  # the engine moved on
    conn = psycopg2.connect(store.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT item FROM orders WHERE item = 'late'")
            assert cur.fetchall() == [("late",)]
            cur.execute("SELECT count(*) FROM rms_message WHERE seq = (SELECT id FROM rms_sequence "
                        "WHERE seq_key = %s) AND number > 3", (old_key,))
            assert cur.fetchone()[0] == 0  # nothing of the declined enqueue stayed
    finally:
        conn.close()


def test_two_xa_calls_in_one_transaction_keep_their_order(one_database):
    """The first request's enqueue rides to the COMMIT; the second's, a statement of its own, sends
    it first (and reads its number there): the two are numbered in the order they were made."""
    tm, ds, store, rc = one_database
    assert [_call(tm, ds, rc, f"q{i}") for i in range(3)] == ["re:q0", "re:q1", "re:q2"]
    with tm.transaction():
        with ds.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO orders VALUES ('a')")
        first = rc.service.echo("a")
        second = rc.service.echo("b")
    assert (first.result(timeout=60), second.result(timeout=60)) == ("re:a", "re:b")
    assert wait_for(lambda: service.ECHOED == ["q0", "q1", "q2", "a", "b"])
