"""A large outgoing payload crosses the PostgreSQL connection as its bytes, not as hex text.

psycopg2 sends a bytea parameter inside the statement's text, in hex: twice the payload's
size, which the server's lexer then walks character by character (47% of PostgreSQL's CPU
for a 1 MiB enqueue, perf) and decodes.  The PostgreSQL store writes a payload of
``COPY_PAYLOAD_AT`` bytes or more with ``COPY ... (FORMAT binary)`` instead, and reads one
back so too.  These tests count the bytes the process hands to the socket and reads from it
(``/proc/self/io``), not time, and check that every byte (and every other column) comes back
as it went in, on every store, in a transaction of its own and in an XA branch.
"""

from __future__ import annotations

import os
import socket
import struct

import pytest

from txmanager import TransactionManager
from wsrm_plugin.store import StorageManager
from wsrm_plugin.store.sql.large_payloads import COPY_PAYLOAD_AT

from .test_managers import new_rms

MIB = 1 << 20


def _tcp_bytes(conn) -> tuple[int, int]:
    """(bytes sent and acknowledged, bytes received) on ``conn``'s TCP connection so far: the
    kernel's ``tcp_info`` (``tcpi_bytes_acked``, ``tcpi_bytes_received``; Linux 4.1 and later).
    libpq sends and receives with send(2)/recv(2), which ``/proc/self/io`` does not count."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    finally:
        sock.close()
    return struct.unpack_from("<QQ", info, 120)


def _payload(size: int) -> bytes:
    """Every byte value, quotes and backslashes included, and then some randomness."""
    return (bytes(range(256)) * (size // 512 + 1))[: size // 2] + os.urandom(size - size // 2)


def _started(store: StorageManager) -> None:
    with store.begin() as tx:
        new_rms(tx)
        tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)


@pytest.mark.parametrize("size", [100, COPY_PAYLOAD_AT - 1, COPY_PAYLOAD_AT, MIB])
def test_a_payload_of_any_size_comes_back_as_it_went_in(store: StorageManager, size: int) -> None:
    payload = _payload(size)
    _started(store)
    with store.begin() as tx:
        sent = tx.rms_messages.enqueue("k1", payload, action="urn:op-é", soap_version="1.1",
                                       message_id="urn:m-ü'1", reply_callback="app:on_reply",
                                       reply_context=b"\x00ctx\\'", send_at=12.5, now=10.0)
    with store.begin() as tx:  # a rolled back enqueue gives its number back, with COPY too
        tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.1", message_id="urn:gone")
        tx.rollback()
    with store.begin() as tx:
        tx.rms_messages.enqueue("k1", payload[::-1], action="urn:op", soap_version="1.2", message_id="urn:m2",
                                last=True, awaits_reply=True)
    with store.begin() as tx:
        first, second = tx.rms_messages.list_for("k1")
        assert first == sent
        assert (first.payload, first.action, first.message_id, first.reply_context) == (
            payload, "urn:op-é", "urn:m-ü'1", b"\x00ctx\\'")
        assert (first.next_send_at, first.created_at, first.reply_pending, first.last) == (12.5, 10.0, True, False)
        assert (second.number, second.payload, second.last, second.reply_pending) == (2, payload[::-1], True, True)
        due = tx.rms_messages.due_messages(now=1e10, limit=10, per_sequence=10)
        assert [(m.number, m.payload) for m in due] == [(1, payload), (2, payload[::-1])]
        # the sender's round: payloads read apart (PostgreSQL's COPY) only for what it goes on with
        bare = tx.rms_messages.due_messages(now=1e10, limit=10, per_sequence=10, payloads=False)
        left_out = store.url.startswith("postgresql") and size >= COPY_PAYLOAD_AT
        assert [m.payload is None for m in bare] == [left_out, left_out]
        assert tx.rms_messages.with_payloads(bare[1:]) == due[1:]
        assert tx.rms_messages.get("k1", 2).payload == payload[::-1]


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_large_payload_crosses_the_connection_once_each_way(store: StorageManager) -> None:
    payload = _payload(MIB)
    _started(store)
    with store.begin() as tx:
        tx.rms_messages.enqueue("k1", b"warm", action="urn:op", soap_version="1.1", message_id="urn:warm")
        tx.rms_messages.due_messages(now=1e10)
    with store.begin() as tx:
        sent, received = _tcp_bytes(tx.conn)
        tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.1", message_id="urn:m")
        sent = _tcp_bytes(tx.conn)[0] - sent
    assert MIB <= sent < MIB + MIB // 8, f"{sent} bytes sent to enqueue 1 MiB (in hex: twice as many)"
    with store.begin() as tx:
        before = _tcp_bytes(tx.conn)[1]
        (due,) = tx.rms_messages.due_messages(now=1e10, limit=10, per_sequence=10)[1:]
        received = _tcp_bytes(tx.conn)[1] - before
    assert due.payload == payload
    assert MIB <= received < MIB + MIB // 8, f"{received} bytes received to read 1 MiB (in hex: twice as many)"


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
def test_a_large_payload_goes_by_copy_in_an_xa_branch_too(store: StorageManager, tmp_path) -> None:
    """The store's branch of a global transaction: committed with it, or rolled back with it."""
    payload = _payload(MIB)
    _started(store)
    tm = TransactionManager(node="copytest", log=tmp_path / "tm.log", default_timeout=60)
    try:
        with tm.transaction():
            with store.begin(xa=tm) as tx:
                before = _tcp_bytes(tx.conn)[0]
                tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.1", message_id="urn:xa1")
                assert _tcp_bytes(tx.conn)[0] - before < MIB + MIB // 8
        with pytest.raises(RuntimeError), tm.transaction():
            with store.begin(xa=tm) as tx:
                tx.rms_messages.enqueue("k1", payload, action="urn:op", soap_version="1.1", message_id="urn:xa2")
            raise RuntimeError("the application changed its mind")
    finally:
        tm.close()
    with store.begin() as tx:
        assert [(m.message_id, m.payload) for m in tx.rms_messages.list_for("k1")] == [("urn:xa1", payload)]


@pytest.mark.parametrize("size", [100, COPY_PAYLOAD_AT, MIB])
def test_a_buffered_payload_comes_back_as_it_went_in(store: StorageManager, size: int) -> None:
    """The invoker's buffer (a received message waiting for its delivery): put, claimed, read
    ahead in a batch, looked at; on PostgreSQL a large one goes and comes by COPY."""
    payloads = [_payload(size) for _ in range(3)]
    with store.begin() as tx:
        for number, payload in enumerate(payloads, 1):
            assert tx.invoker.put("s1", number, payload, action="urn:op-é", soap_version="1.1",
                                  message_id=f"urn:m-ü{number}", reply_to="http://client/", now=5.0)
    with store.begin() as tx:
        if store.url.startswith("postgresql"):
            before = _tcp_bytes(tx.conn)[1]
        first = tx.invoker.claim_next()
        assert (first.number, first.payload, first.action, first.message_id, first.reply_to, first.received_at) == (
            1, payloads[0], "urn:op-é", "urn:m-ü1", "http://client/", 5.0)
        if store.url.startswith("postgresql") and size == MIB:
            assert _tcp_bytes(tx.conn)[1] - before < MIB + MIB // 8  # not in hex
        tx.invoker.mark_delivered("s1", 1)
        assert tx.invoker.get("s1", 3).payload == payloads[2]
        second = tx.invoker.next_deliverable("s1")
        assert (second.number, second.payload) == (2, payloads[1])
        tx.invoker.mark_delivered("s1", 2)
        assert tx.invoker.next_deliverable("s1").payload == payloads[2]  # read ahead with the second
