"""Under XA on PostgreSQL, an enqueue on a sequence its transaction holds locked rides on the
branch's COMMIT: numbered from the row held, its message and the sequence's number are sent in
the COMMIT's query string (``SqlTransaction.write_later``, ``LazyBeginConnection.ride``), not in
a round trip of their own.  The service's reply is such an enqueue (its receipt locked the reply
sequence's row).  Statements are counted where the store sends them; the writes riding are
counted on the session when the transaction manager commits it.  The store prepares no
statements here: a statement's first PREPARE on a session is a round trip of its own, which
the writes riding then take (tests/zeep_client/test_xa_call_path.py counts the steady state
with prepared statements).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from txmanager import RollbackError, TransactionManager
from txmanager.postgres import PostgresXAResource
from wsrm_plugin.store.postgres import PostgresStore
from wsrm_plugin.store.sql import SqlTransaction

from .test_managers import enqueue, new_rms

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(fresh_db):
    s = PostgresStore(fresh_db, lock_timeout=10.0, prepare_statements=False)
    with s.begin() as tx:
        new_rms(tx)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
    yield s
    s.close()


@pytest.fixture
def tm(tmp_path):
    manager = TransactionManager(node="ride", log=tmp_path / "tm.log", default_timeout=60)
    yield manager
    manager.close()


@pytest.fixture
def counts(monkeypatch):
    """``sent``: the store's statements (round trips) in this thread; ``riding``: the writes
    riding on each one-phase commit of this thread."""
    me = threading.current_thread()
    seen: dict[str, Any] = {"sent": 0, "riding": []}
    execute = SqlTransaction.execute

    def counted(tx: Any, sql: str, params: Any = (), **kw: Any) -> Any:
        if threading.current_thread() is me:
            seen["sent"] += 1
        return execute(tx, sql, params, **kw)
    monkeypatch.setattr(SqlTransaction, "execute", counted)

    def committing(real: Any) -> Any:
        def commit(resource: Any, *args: Any, **kw: Any) -> Any:
            seen["riding"].append(resource.connection.riding)
            return real(resource, *args, **kw)
        return commit
    monkeypatch.setattr(PostgresXAResource, "end_and_commit_one_phase",
                        committing(PostgresXAResource.end_and_commit_one_phase))
    monkeypatch.setattr(PostgresXAResource, "commit", committing(PostgresXAResource.commit))
    return seen


def messages(store: PostgresStore) -> tuple[list[int], int]:
    """The messages of "k1" committed, and its next number, read without waiting for a lock."""
    with store.begin() as tx:
        rows = tx.all("SELECT number FROM rms_message "
                      "WHERE seq = (SELECT id FROM rms_sequence WHERE seq_key = 'k1') ORDER BY number")
        return [r[0] for r in rows], tx.rms.peek("k1").next_number


def test_an_enqueue_on_a_sequence_held_locked_rides_on_the_commit(store, tm, counts):
    with tm.transaction():
        tx = store.begin(xa=tm)
        assert tx.rms.get("k1").next_number == 1  # locked FOR UPDATE: one statement
        sent = counts["sent"]
        msgs = enqueue(tx, n=2)
        assert counts["sent"] == sent, "an enqueue sent a statement of its own"
        assert [m.number for m in msgs] == [1, 2] and tx.conn.riding == 2
        assert messages(store) == ([], 1)  # nothing sent yet, nothing seen from outside
    assert counts["riding"] == [3]  # the two messages and the sequence's number, with the COMMIT
    assert messages(store) == ([1, 2], 3)


def test_an_enqueue_on_a_sequence_held_only_beside_enqueues_takes_its_number_by_statement(store, tm, counts):
    """FOR KEY SHARE lets another transaction take the next number meanwhile: the row held says
    nothing about it, so the number is taken by the enqueue's own UPDATE, as before."""
    with tm.transaction():
        tx = store.begin(xa=tm)
        tx.rms.get("k1", beside_enqueues=True)
        assert "k1" in tx.shared_rms
        sent = counts["sent"]
        assert [m.number for m in enqueue(tx)] == [1]
        assert counts["sent"] == sent + 1 and tx.conn.riding == 0
        assert [m.number for m in enqueue(tx)] == [2]  # its row now written by this transaction: held
        assert counts["sent"] == sent + 1 and tx.conn.riding == 1
    assert messages(store) == ([1, 2], 3)


def test_an_enqueue_on_a_sequence_not_held_or_outside_xa_sends_its_statement(store, tm, counts):
    with tm.transaction():
        tx = store.begin(xa=tm)
        assert [m.number for m in enqueue(tx)] == [1]
        assert counts["sent"] == 1 and tx.conn.riding == 0
    with store.begin() as tx:  # a local transaction: nothing rides
        tx.rms.get("k1")
        sent = counts["sent"]
        assert [m.number for m in enqueue(tx)] == [2]
        assert counts["sent"] == sent + 1
    assert messages(store) == ([1, 2], 3)


def test_a_large_payload_is_copied_in_its_round_trip(store, tm, counts):
    with tm.transaction():
        tx = store.begin(xa=tm)
        tx.rms.get("k1")
        msg = tx.rms_messages.enqueue("k1", b"<big>" + b"x" * 40_000 + b"</big>", action="urn:op",
                                      soap_version="1.2", message_id="urn:big")
        assert msg.number == 1 and tx.conn.riding == 0
    assert messages(store) == ([1], 2)


def test_a_riding_enqueue_refused_at_the_commit_rolls_the_transaction_back_with_its_error(store, tm, fresh_db):
    import psycopg2

    conn = psycopg2.connect(fresh_db)
    with conn, conn.cursor() as cur:
        cur.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$BEGIN RAISE EXCEPTION 'refused by the test'; END$$")
        cur.execute("CREATE TRIGGER refuse BEFORE INSERT ON rms_message FOR EACH ROW "
                    "WHEN (NEW.message_id = 'urn:refused') EXECUTE FUNCTION refuse()")
    conn.close()
    with pytest.raises(RollbackError) as excinfo:
        with tm.transaction():
            tx = store.begin(xa=tm)
            tx.rms.get("k1")
            tx.rms_messages.enqueue("k1", b"<env/>", action="urn:op", soap_version="1.2",
                                    message_id="urn:refused")
            assert tx.conn.riding == 1
    cause: Any = excinfo.value
    while cause is not None and not isinstance(cause, psycopg2.Error):
        cause = cause.__cause__ or getattr(cause, "cause", None)
    assert cause is not None and cause.pgcode == "P0001" and "refused by the test" in str(cause), excinfo.value
    assert messages(store) == ([], 1)  # neither the message nor its number
    with tm.transaction():  # the store goes on
        tx = store.begin(xa=tm)
        tx.rms.get("k1")
        enqueue(tx)
    assert messages(store) == ([1], 2)


def test_a_statement_prepared_mid_transaction_leaves_the_writes_riding_on_the_commit(fresh_db, tm, counts):
    """With prepared statements (the default), a statement sent for the second time on a session
    is PREPAREd first, in a round trip of its own: the writes riding wait for the COMMIT still
    (the PREPARE goes through a cursor of psycopg2's own, which nothing rides on)."""
    store = PostgresStore(fresh_db, lock_timeout=10.0, pool_size=1)
    try:
        with store.begin() as tx:
            new_rms(tx)
            tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        for _ in range(4):  # seen, then prepared, then executed as prepared
            with tm.transaction():
                tx = store.begin(xa=tm)
                tx.rms.get("k1")
                enqueue(tx, n=2)
        assert counts["riding"] == [3] * 4
        assert messages(store) == (list(range(1, 9)), 9)
    finally:
        store.close()


def test_at_most_so_many_writes_ride_at_once(store, tm, counts):
    """A transaction enqueuing many (a Spark partition under XA) keeps a bounded query string:
    the write after ``RIDING_AT_MOST`` riding is sent, with them in front of it."""
    from wsrm_plugin.store.sql.transaction import RIDING_AT_MOST

    with tm.transaction():
        tx = store.begin(xa=tm)
        tx.rms.get("k1")
        sent = counts["sent"]
        enqueue(tx, n=RIDING_AT_MOST)
        assert tx.conn.riding == RIDING_AT_MOST and counts["sent"] == sent
        enqueue(tx, n=3)
        assert counts["sent"] == sent + 1 and tx.conn.riding == 2
    assert counts["riding"] == [3]
    assert messages(store) == (list(range(1, RIDING_AT_MOST + 4)), RIDING_AT_MOST + 4)


def _rides_one_way(tx, message_id: str, numbers: list[int]) -> bool:
    """A one-way message's enqueue riding to the commit (no caller claims it) on "k1", its number
    put in ``numbers`` once committed."""
    import time

    return tx.rms_messages.enqueue_claiming_at_commit(
        "k1", b"<env/>", action="urn:op", soap_version="1.2", message_id=message_id, target=None,
        next_send_at=time.time(), enqueued=lambda msg, *_: numbers.append(msg.number), otherwise=lambda: None)


def test_a_one_way_enqueue_riding_to_the_commit_keeps_its_generic_plan_with_no_setting(fresh_db, tm):
    """``enqueue_claiming_at_commit`` of a message no caller claims (a one-way call under XA)
    goes with no ``SET LOCAL`` in front: ``SET LOCAL plan_cache_mode TO force_generic_plan``
    was a statement more for the server a message.  Every part of it goes by a key, and
    PostgreSQL's own choice keeps its generic plan after the five custom plans of a session's
    first executions: none after them (the generic estimate is never dearer).  The statement
    after it is planned as before."""

    from wsrm_plugin.store.sql import rms

    assert all("SET LOCAL" not in sql for (claims, _, _, _), (sql, _) in rms._ENQUEUES_AT_COMMIT.items() if not claims)
    assert all(sql.startswith(rms._PLANNED_ONCE) for (claims, _, _, _), (sql, _) in rms._ENQUEUES_AT_COMMIT.items()
               if claims)
    store = PostgresStore(fresh_db, lock_timeout=10.0, pool_size=1)
    try:
        with store.begin() as tx:
            new_rms(tx)
            tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        numbers: list[int] = []
        for i in range(16):
            with tm.transaction():
                tx = store.begin(xa=tm)
                assert _rides_one_way(tx, f"urn:m{i}", numbers)
        assert numbers == list(range(1, 17))
        from .test_backlog import _plans

        plans = _plans(store, "%set_config('wsrm.enqueued'%")
        with store.begin() as tx:
            after = tx.one("SHOW plan_cache_mode")[0]
        # prepared at its second sending: 15 executions, the first five planned for their values
        assert plans and sum(c for _, c in plans) == 5 and sum(g for g, _ in plans) >= 10, plans
        assert after == "auto"
        assert messages(store) == (list(range(1, 17)), 17)
    finally:
        store.close()


def test_a_one_way_enqueue_riding_to_the_commit_reads_no_row_back(fresh_db, tm):
    """A message no caller claims, with no RMD row read beside: the statement keeps its number
    only, no JSON of the sequence's row (``row_to_json``: about 42k instructions a message for
    PostgreSQL, and no one read it).  Where the row is wanted before the commit (another enqueue
    on the sequence in the same transaction), the ride goes then and the row is read, locked by
    this transaction already: numbered on from it."""

    from wsrm_plugin.store.sql import rms

    assert all(("row_to_json" in sql) == (claims or reads)
               for (claims, reads, _, _), (sql, _) in rms._ENQUEUES_AT_COMMIT.items())
    store = PostgresStore(fresh_db, lock_timeout=10.0)
    try:
        with store.begin() as tx:
            new_rms(tx)
            tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
        numbers: list[int] = []
        for first in (1, 3):
            with tm.transaction():
                tx = store.begin(xa=tm)
                assert _rides_one_way(tx, f"urn:m{first}", numbers)
                assert tx.rms.get("k1").next_number == first + 1  # the ride sent, the row read
                second = tx.rms_messages.enqueue("k1", b"<env/>", action="urn:op", soap_version="1.2",
                                                 message_id=f"urn:m{first + 1}")
                assert second.number == first + 1
        assert numbers == [1, 3]
        assert messages(store) == ([1, 2, 3, 4], 5)
    finally:
        store.close()
