"""A caller's open XA transaction does not hold up the sender on its sequence (PostgreSQL).

The caller's enqueue takes the sequence's next number with an UPDATE of its row, which stays
locked until the caller's transaction ends (a lone enqueue rides to the COMMIT: here a second
one in the transaction sends the first's UPDATE before it, while the transaction is open).
The sender's claim and the acknowledgements it applies hold the row only against changes of
the sequence's state (``FOR KEY SHARE``): the
messages committed before go out, are delivered and acknowledged while the caller's
transaction is still open, and the caller's message follows its commit, once.

Real engines on loopback HTTP: the client's store in the application's database (one branch,
committed in one phase), its transaction manager, the server on a memory store.  The server's
listener is stopped while the earlier message is committed (it waits, due again), and started
again on the same port while the caller's transaction is open.  A sequence whose send just
failed to a peer thought alive is sent again at once; that holds the row as the claim does,
and does not wait for the caller either (the second test).
"""

from __future__ import annotations

import threading
from urllib.parse import urlsplit

import pytest

from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.store import open_store

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for

pytestmark = pytest.mark.postgres


def _insert(ds: XADataSource, item: str) -> None:
    with ds.connection() as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO sent (item) VALUES (%s)", (item,))


def _attempts(store, number: int) -> int:
    with store.begin() as tx:
        [seq] = tx.rms.list_all()
        return next(m.send_count for m in tx.rms_messages.list_for(seq.key) if m.number == number)


def test_earlier_messages_go_out_and_are_acknowledged_while_a_callers_transaction_is_open(pg_dsn_factory,
                                                                                           tmp_path):
    app = pg_dsn_factory("besidecli", "CREATE TABLE sent (id serial PRIMARY KEY, item text NOT NULL)")
    delivered: list[str] = []
    lock = threading.Lock()

    def application(envelope: bytes, context: object) -> None:
        with lock:
            delivered.append(item_text(envelope) or "")

    tm = TransactionManager(node="beside-client", log=tmp_path / "client.tmlog")
    ds = XADataSource(app, tm)
    store = open_store("postgresql:" + app)
    server = ReliableEngine("memory:", fast_policy(), application=application, name="beside-server")
    client = ReliableEngine(store, fast_policy(), tm=tm, name="beside-client")
    try:
        server.serve()
        server.start()
        client.start()
        port = urlsplit(server.endpoint_address).port
        with tm.transaction():  # opens the sequence
            _insert(ds, "zero")
            client.send(server.endpoint_address, payload("zero"), action=ACTION)
        assert wait_for(lambda: delivered == ["zero"] and client.status().unacked == 0)
        [listener] = server.servers
        listener.stop(timeout=5)  # "first" finds nobody listening: it waits, due again
        with tm.transaction():
            _insert(ds, "first")
            client.send(server.endpoint_address, payload("first"), action=ACTION)
        assert client.status().unacked == 1
        # "first" sent again at least once: past the in-order flow's send again at once, the peer
        # is known silent and "first" only waits for its next due time
        assert wait_for(lambda: _attempts(store, 2) >= 2)
        with tm.transaction():
            _insert(ds, "second")
            client.send(server.endpoint_address, payload("second"), action=ACTION)
            # (its enqueue rides to the COMMIT; the next one needs the row: "second"'s UPDATE goes
            # now, and the row stays locked by it until the commit, the number held)
            client.send(server.endpoint_address, payload("third"), action=ACTION)
            server.serve(port=port)
            # while this transaction is open: "first" claimed, sent, delivered, its acknowledgement
            # applied (before, the claim skipped the sequence and the acknowledgement waited)
            assert wait_for(lambda: delivered == ["zero", "first"] and client.status().unacked == 0), \
                (delivered, client.status().unacked)
        assert wait_for(lambda: delivered == ["zero", "first", "second", "third"]
                        and client.status().unacked == 0), (delivered, client.status().unacked)
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)
        for closeable in (ds, store, tm):
            closeable.close()


def test_a_send_again_at_once_does_not_wait_for_a_callers_open_transaction(pg_dsn_factory, tmp_path):
    """The sender's send-again-at-once (after a failed send to a peer thought alive, or a gap)
    records the attempts with the sequence held as its claim holds it: a caller's transaction
    that took the sequence's next number and is still open does not hold it up (before, it
    locked the row FOR UPDATE and waited up to the store's lock_timeout, 30 s, with the round)."""
    app = pg_dsn_factory("besideagain", "CREATE TABLE sent (id serial PRIMARY KEY, item text NOT NULL)")
    tm = TransactionManager(node="again-client", log=tmp_path / "client.tmlog")
    ds = XADataSource(app, tm)
    store = open_store("postgresql:" + app)
    server = ReliableEngine("memory:", fast_policy(), application=lambda envelope, context: None,
                            name="again-server")
    client = ReliableEngine(store, fast_policy(), tm=tm, name="again-client")
    try:
        server.serve()
        server.start()
        client.start()
        with tm.transaction():  # opens the sequence
            _insert(ds, "zero")
            client.send(server.endpoint_address, payload("zero"), action=ACTION)
        assert wait_for(lambda: client.status().unacked == 0)
        [listener] = server.servers
        listener.stop(timeout=5)
        with tm.transaction():
            _insert(ds, "first")
            client.send(server.endpoint_address, payload("first"), action=ACTION)
        assert wait_for(lambda: _attempts(store, 2) >= 1)
        with store.begin() as tx:
            [seq] = tx.rms.list_all()
        done = threading.Event()
        again: list[object] = []

        def send_again() -> None:
            again.extend(client.retransmission._reclaim(seq, [2]))
            done.set()

        with tm.transaction():
            _insert(ds, "second")
            client.send(server.endpoint_address, payload("second"), action=ACTION)
            client.send(server.endpoint_address, payload("third"), action=ACTION)  # "second"'s UPDATE sent
            before = _attempts(store, 2)
            worker = threading.Thread(target=send_again, daemon=True)
            worker.start()
            assert wait_for(done.is_set), "the send again waited for the caller's open transaction"
            assert len(again) == 1 and _attempts(store, 2) > before
        worker.join(timeout=60)
    finally:
        client.stop(timeout=5)
        server.stop(timeout=5)
        for closeable in (ds, store, tm):
            closeable.close()
