"""Engines sharing a PostgreSQL store take sequences' rows in one order.

Worker processes, or several clients in one process, share a store and
claim each other's sequences, so two engines' rounds may settle the same
sequences.  Each taking the rows in the order its round met them deadlocked
(four client engines on one store: PostgreSQL chose a caller's enqueue as
the victim, and the call failed).  A settle that locked them against every writer
(``FOR UPDATE``) waited for another engine's claim of them, and the claim, following a
row's update chain, waited for the settle (PostgreSQL waits there even under SKIP LOCKED):
the settle now holds them as a claim does, against close and terminate only.
"""

from __future__ import annotations

import threading
import time

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.store import open_store
from wsrm_plugin.wire.namespaces import RM11, SOAP12, WSA_2005_08 as WSA10

from .conftest import fast_policy
from .support import ACTION, payload


def _sequences(engine: ReliableEngine, messages: int, sent: int = 0) -> list:
    """Two started sequences, "k-a" and "k-b", with ``messages`` each, the first ``sent`` sent once."""
    with engine.store.begin() as tx:
        for key in ("k-a", "k-b"):
            tx.rms.create(key, target="http://127.0.0.1:9/", acks_to=WSA10.anonymous, rm_version=RM11.ns,
                          wsa_version=WSA10.ns)
            tx.rms.update(key, sequence_id=f"urn:uuid:{key}", started=True)
            for n in range(1, messages + 1):
                tx.rms_messages.enqueue(key, payload("m"), action=ACTION, soap_version=SOAP12.ns,
                                        message_id=f"urn:uuid:m{n}-{key}")
            for n in range(1, sent + 1):
                tx.rms_messages.record_send_attempt(key, n, next_send_at=1e12)
    with engine.store.begin() as tx:
        return [tx.rms.get("k-a"), tx.rms.get("k-b")]


def test_a_round_settles_its_sequences_in_key_order_so_two_rounds_never_deadlock(pg_dsn_factory) -> None:
    url = "postgresql:" + pg_dsn_factory("settle")
    engine = ReliableEngine(url, fast_policy(), name="settle")  # not started: only its worker's settle runs
    other = open_store(url)
    try:
        seq_a, seq_b = _sequences(engine, messages=1)
        outcome: list[object] = []

        def settle() -> None:  # this round met b's messages first
            try:
                engine.retransmission._make_due([(seq_b, {1}, set()), (seq_a, {1}, set())])
            except Exception as exc:  # noqa: BLE001 -- asserted below
                outcome.append(exc)
            else:
                outcome.append("settled")

        with other.begin() as tx:  # another engine's round, taking a, then b
            tx.rms.get("k-a")
            thread = threading.Thread(target=settle)
            thread.start()
            time.sleep(0.5)  # the settle waits for a, holding nothing (key order), not b
            tx.rms.get("k-b")  # taken first by the settle, this was a deadlock
        thread.join(15)
        assert outcome == ["settled"]
        assert engine.retransmission.fast_retransmits == 2
    finally:
        other.close()
        engine.stop(timeout=5)


def test_a_settle_goes_on_beside_another_engines_claim_of_its_sequences(pg_dsn_factory) -> None:
    url = "postgresql:" + pg_dsn_factory("settle")
    engine = ReliableEngine(url, fast_policy(), name="settle")  # not started: only its worker's settle runs
    other = open_store(url)
    try:
        seq_a, seq_b = _sequences(engine, messages=2, sent=1)  # 1 sent, 2 due
        claim = other.begin(durable=False)  # another engine's claim: both sequences held, their 2s locked
        assert sorted((m.sequence_key, m.number) for m in claim.rms_messages.due_messages(
            limit=50, per_sequence=50)) == [("k-a", 2), ("k-b", 2)]
        settled = threading.Event()

        def settle() -> None:  # 1 proved lost in both
            engine.retransmission._make_due([(seq_a, {1}, set()), (seq_b, {1}, set())])
            settled.set()

        thread = threading.Thread(target=settle)
        thread.start()
        try:
            assert settled.wait(10), "the settle waited for the claim"
        finally:
            claim.commit()
            thread.join(15)
        assert engine.retransmission.fast_retransmits == 2
    finally:
        other.close()
        engine.stop(timeout=5)


def _lock_waits(url: str) -> int:
    """Sessions of the store's database waiting for a lock now."""
    import psycopg2

    conn = psycopg2.connect(url.partition(":")[2])
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock'")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def test_a_settle_keeps_no_sequence_held_while_it_waits_for_the_next(pg_dsn_factory) -> None:
    """A settle of "k-a" and "k-b" made a's messages due, then waited for b (another writer holds
    it): in one transaction it kept a's writer lock meanwhile, and an acknowledgement of a, which
    takes that lock, queued behind the settle's wait for b (waits over 200 ms, 16 client engines
    on one store).  Each sequence is now settled and committed by itself."""
    url = "postgresql:" + pg_dsn_factory("settle")
    engine = ReliableEngine(url, fast_policy(), name="settle")  # not started: only its worker's settle runs
    other = open_store(url)
    acker = open_store(url, lock_timeout=5.0)  # the acknowledgement fails if a's lock stays held
    try:
        seq_a, seq_b = _sequences(engine, messages=2, sent=2)
        settled = threading.Event()

        def settle() -> None:  # 1 proved lost in both
            engine.retransmission._make_due([(seq_a, {1}, set()), (seq_b, {1}, set())])
            settled.set()

        held = other.begin()
        held.rms.get("k-b")  # another writer holds b against everyone (a close, a terminate)
        thread = threading.Thread(target=settle)
        thread.start()
        try:
            deadline = time.monotonic() + 15
            while _lock_waits(url) < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not settled.is_set()  # the settle waits for b
            with acker.begin() as tx:  # the peer acknowledges a meanwhile, beside enqueues
                outcome = tx.rms_messages.acknowledge_sequence("urn:uuid:k-a", [(1, 2)], beside_enqueues=True)
            assert outcome is not None and outcome[1] == ([1, 2], False)
        finally:
            held.commit()
            thread.join(15)
        assert settled.is_set()
        assert engine.retransmission.fast_retransmits == 2  # a's 1 (acknowledged after), and b's
    finally:
        acker.close()
        other.close()
        engine.stop(timeout=5)
