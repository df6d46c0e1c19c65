"""A one-way call under XA across two databases: the application's row in its database, the
request's enqueue in the store's, one global transaction whose decision is the store's commit
mark (txmanager.marks): the application's branch is prepared, the store's commits last, in one
phase, with the mark.

The enqueue rides on the store branch's COMMIT (``Source._enqueue_on_current_at_commit``,
``LazyBeginConnection.ride_to_commit``): the branch's BEGIN, the enqueue, the mark and the
COMMIT go in one query string, where the enqueue took a round trip of its own before (with the
BEGIN in front of it), and the mark and the COMMIT another.  Counted on the store's session as
the server received it (its log); each call is delivered, once.  Counts, never time.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import zeep

from interceptors.spyne_server.service import reliable_service
from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import PostgresXAResource, XADataSource
from wsrm_plugin.engine import ReceiptAtCommit
from wsrm_plugin.store.postgres import PostgresStore
from wsrm_plugin.store.sql import rms

from . import service
from .conftest import fast_policy
from .test_xa_call_path import _LOG_STATEMENTS, QUIET, _sent

pytestmark = pytest.mark.postgres

CALLS = 4


def _service() -> Any:
    """The one-way calls' reliable service, on memory stores, served and started."""
    service.reset()
    svc = reliable_service(service.spyne_app(), "memory:", fast_policy(**QUIET))
    svc.serve()
    return svc.start()


def _marking_sessions(monkeypatch: Any) -> list[int]:
    """The backend of each store session that commits with a commit mark, in order, from now on."""
    marked: list[int] = []
    commit_marked = PostgresXAResource.commit_marked

    def recording(resource: Any, *args: Any, **kw: Any) -> Any:
        marked.append(resource.connection.info.backend_pid)
        return commit_marked(resource, *args, **kw)
    monkeypatch.setattr(PostgresXAResource, "commit_marked", recording)
    return marked


def _rows_parsed(monkeypatch: Any) -> list[str]:
    """The riding enqueues' outcomes whose rows were parsed (their JSON), from now on."""
    parsed: list[str] = []

    def loads(text: str) -> Any:
        parsed.append(text)
        return json.loads(text)
    monkeypatch.setattr(rms, "json", SimpleNamespace(loads=loads))
    return parsed


def _branch(sent: list[str]) -> list[str]:
    """What the store branch sent, of what its session sent (the sender's transactions use it
    too, before and after): from its BEGIN to its commit mark."""
    last = max(i for i, text in enumerate(sent) if "txm_commit_mark" in text)
    first = max(i for i in range(last + 1) if sent[i].startswith("BEGIN"))
    return sent[first:last + 1]


def test_a_one_way_xa_calls_enqueue_rides_on_the_commit_mark_of_the_store_branch(
        pg_dsn_factory: Any, pg_server: Any, tmp_path: Any, monkeypatch: Any) -> None:
    app_dsn = pg_dsn_factory("xa2app", "CREATE TABLE orders (item text PRIMARY KEY)")
    store = PostgresStore(pg_dsn_factory("xa2store", _LOG_STATEMENTS))
    tm = TransactionManager(node="xa2-one-way", log=tmp_path / "tm.log")
    ds = XADataSource(app_dsn, tm)
    svc = _service()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), store, fast_policy(**QUIET), tm=tm)
    marked = _marking_sessions(monkeypatch)

    def call(text: str) -> Any:
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO orders VALUES (%s)", (text,))
            return rc.service.record(text)
    try:
        call("first")  # opens the sequence (its CreateSequence, its enqueue by statement)
        parsed = _rows_parsed(monkeypatch)
        for i in range(CALLS):
            offset = pg_server.log_path.stat().st_size
            receipt = call(f"r{i}")
            sent = _branch(_sent(pg_server.log_path, offset, marked[-1]))
            # one round trip: BEGIN, the enqueue, the mark, the COMMIT, the read
            assert len(sent) == 1, sent
            (one,) = sent
            assert one.startswith("BEGIN;") and "SAVEPOINT" not in one, sent  # nothing else to keep
            assert one.index("txm_commit_mark") < one.index(";COMMIT;"), sent
            # after the COMMIT, the read of the setting alone (no table: no commit record)
            assert one.endswith(";COMMIT;SHOW wsrm.enqueued"), sent
            assert isinstance(receipt, ReceiptAtCommit) and receipt.numbered and receipt.number == i + 2
        assert parsed == []  # a one-way message's sender needs only its number: the rows stay unread
        assert wait_for(lambda: sorted(service.RECEIVED) == sorted(["first", *(f"r{i}" for i in range(CALLS))]))
        assert wait_for(lambda: rc.engine.store.status().unacked == 0)
        assert len(service.RECEIVED) == CALLS + 1  # each once
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        ds.close()
        tm.close()


def test_two_one_way_xa_calls_in_one_transaction_take_no_more_round_trips_and_keep_their_order(
        pg_dsn_factory: Any, pg_server: Any, tmp_path: Any, monkeypatch: Any) -> None:
    """The first enqueue rides to the COMMIT; the second needs the sequence's row: the first's
    write and its read are sent then (its row, locked by its UPDATE, is read there, not again),
    and the second rides on the COMMIT with the mark: two round trips, as when the first took
    its number by a statement of its own (three if the second read the row again)."""
    app_dsn = pg_dsn_factory("xa2app2", "CREATE TABLE orders (item text PRIMARY KEY)")
    # (no statement prepared: a statement's first PREPARE on a session is a round trip of its own)
    store = PostgresStore(pg_dsn_factory("xa2store2", _LOG_STATEMENTS), prepare_statements=False)
    tm = TransactionManager(node="xa2-two", log=tmp_path / "tm.log")
    ds = XADataSource(app_dsn, tm)
    svc = _service()
    rc = reliable_client(zeep.Client(svc.url + "?wsdl"), store, fast_policy(**QUIET), tm=tm)
    marked = _marking_sessions(monkeypatch)
    try:
        with tm.transaction():
            rc.service.record("first")  # opens the sequence
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO orders VALUES ('first')")
        offset = pg_server.log_path.stat().st_size
        parsed = _rows_parsed(monkeypatch)
        with tm.transaction():
            with ds.connection() as conn, conn.cursor() as cur:
                cur.execute("INSERT INTO orders VALUES ('pair')")
            one, two = rc.service.record("one"), rc.service.record("two")
        assert len(parsed) == 1, parsed  # the first's rows, read for the second (held, not read again)
        sent = _branch(_sent(pg_server.log_path, offset, marked[-1]))
        assert len(sent) == 2, "\n".join(sent)
        # the first, and its read inside the branch, with the sequence's row it wrote
        assert sent[0].startswith("BEGIN;") and ";SELECT current_setting('wsrm.enqueued')" in sent[0], sent
        assert "txm_commit_mark" in sent[1] and sent[1].endswith("COMMIT"), sent
        assert (one.number, two.number) == (2, 3)
        assert wait_for(lambda: service.RECEIVED == ["first", "one", "two"])
    finally:
        rc.stop(timeout=5)
        svc.stop(timeout=5)
        ds.close()
        tm.close()
