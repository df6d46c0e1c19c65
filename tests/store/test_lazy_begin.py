"""The PostgreSQL store's local transactions open with their first statement that writes or locks.

Reads before it run on their own (READ COMMITTED reads the same in a transaction or not), so a
worker's poll that finds nothing is one round trip, and a transaction that does write still holds
its locks and commits or rolls back as a whole."""

from __future__ import annotations

import psycopg2
import psycopg2.errors
import psycopg2.extensions as ext
import pytest

from wsrm_plugin.store import StorageManager, StoreError

from .conftest import KINDS
from .test_managers import new_rmd, put

pytestmark = pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)


def test_a_poll_that_only_reads_opens_no_transaction(store: StorageManager) -> None:
    with store.begin() as tx:
        assert tx.rmd.needing_ack(now=1e12) == []
        assert tx.rms.needing_work(now=1e12) == []
        assert tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
        assert not tx.begun


def test_the_first_lock_opens_the_transaction_and_holds_the_row_to_the_end(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    other = psycopg2.connect(store.dsn)
    try:
        with store.begin() as tx:
            tx.rmd.needing_ack(now=1e12)  # a read first: not in the transaction
            assert tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_IDLE
            tx.rmd.get("s1")  # SELECT ... FOR UPDATE: BEGIN goes with it
            assert tx.begun and tx.conn.info.transaction_status == ext.TRANSACTION_STATUS_INTRANS
            with pytest.raises(psycopg2.errors.LockNotAvailable), other.cursor() as cur:
                cur.execute("SELECT 1 FROM rmd_sequence WHERE sequence_id = 's1' FOR UPDATE NOWAIT")
            other.rollback()
            tx.rmd.record_received("s1", 1)
        with other.cursor() as cur:  # committed, and the lock released
            cur.execute("SELECT received FROM rmd_sequence WHERE sequence_id = 's1' FOR UPDATE NOWAIT")
            assert cur.fetchone()[0] == "1"
        other.rollback()
    finally:
        other.close()


def test_a_transaction_that_began_late_rolls_back_whole(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    with pytest.raises(RuntimeError), store.begin() as tx:
        tx.invoker.held("in", tx.rmd.get("s1").received)
        tx.rmd.record_received("s1", 1)
        put(tx, "in", 1)
        raise RuntimeError("the caller gives up")
    with store.begin() as tx:
        assert tx.rmd.get("s1").received.count == 0
        assert tx.invoker.claim_next() is None


def test_a_failed_statement_ends_the_transaction_and_the_session_is_reused(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rmd(tx)
    with pytest.raises(Exception), store.begin() as tx:
        tx.rmd.record_received("s1", 1)
        new_rmd(tx)  # a duplicate: the statement fails, the transaction is doomed
    for _ in range(3):  # the pooled session comes back idle, ready for a branch or a local transaction
        with store.begin() as tx:
            assert tx.rmd.get("s1").received.count == 0
    assert all(r._session.autocommit is False for r in store._idle)


def _synchronous_commit(tx) -> str:
    with tx.conn.cursor() as cur:
        cur.execute("SHOW synchronous_commit")
        return cur.fetchone()[0]


def test_a_transaction_begun_not_durable_commits_without_waiting_for_the_disk(store: StorageManager) -> None:
    """``durable=False`` (a send attempt, an acknowledgement applied) goes out with the BEGIN, for
    that transaction only; ``make_durable`` (a sequence faulted in it) takes it back."""
    with store.begin() as tx:
        new_rmd(tx)
    with store.begin(durable=False) as tx:
        tx.rmd.get("s1")
        assert _synchronous_commit(tx) == "off"
        tx.rmd.record_received("s1", 1)
    with store.begin(durable=False) as tx:
        tx.rmd.get("s1")
        tx.make_durable()
        assert _synchronous_commit(tx) == "on"
        tx.rmd.record_received("s1", 2)
    with store.begin(durable=False) as tx:
        tx.make_durable()  # before anything began: the transaction simply begins durable
        tx.rmd.get("s1")
        assert _synchronous_commit(tx) == "on"
    with store.begin() as tx:  # the session the pool gives back is durable again
        tx.rmd.get("s1")
        assert _synchronous_commit(tx) == "on"
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 2)]


def test_a_commit_that_postgresql_turns_into_a_rollback_raises(store: StorageManager) -> None:
    """A statement that failed where the store did not see it (on the session behind its back, or
    a bug) leaves the transaction aborted; PostgreSQL then answers COMMIT with ROLLBACK and no
    error.  The store must not report that as committed: a receive would acknowledge a message
    that is not in the store."""
    with store.begin() as tx:
        new_rmd(tx)
    with pytest.raises(StoreError, match="COMMIT rolled the transaction back"), store.begin() as tx:
        tx.rmd.record_received("s1", 1)
        with pytest.raises(psycopg2.errors.DivisionByZero), tx.conn.cursor() as cur:
            cur.execute("SELECT 1 / 0")  # unseen by the store
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == []  # nothing of it was written
        tx.rmd.record_received("s1", 1)  # and the pooled session works again
    with store.begin() as tx:
        assert list(tx.rmd.get("s1").received.ranges) == [(1, 1)]
