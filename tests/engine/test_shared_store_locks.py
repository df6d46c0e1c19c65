"""Engines sharing a PostgreSQL store take sequences' rows in one order.

Worker processes, or several clients in one process, share a store and
claim each other's sequences, so two engines' rounds may settle the same
sequences.  Each taking the rows in the order its round met them deadlocked
(four client engines on one store: PostgreSQL chose a caller's enqueue as
the victim, and the call failed).
"""

from __future__ import annotations

import threading
import time

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.store import open_store
from wsrm_plugin.wire.namespaces import RM11, SOAP12, WSA_2005_08 as WSA10

from .conftest import fast_policy
from .support import ACTION, payload


def test_a_round_settles_its_sequences_in_key_order_so_two_rounds_never_deadlock(pg_dsn_factory) -> None:
    url = "postgresql:" + pg_dsn_factory("settle")
    engine = ReliableEngine(url, fast_policy(), name="settle")  # not started: only its worker's settle runs
    other = open_store(url)
    try:
        with engine.store.begin() as tx:
            for key in ("k-a", "k-b"):
                tx.rms.create(key, target="http://127.0.0.1:9/", acks_to=WSA10.anonymous, rm_version=RM11.ns,
                              wsa_version=WSA10.ns)
                tx.rms.update(key, sequence_id=f"urn:uuid:{key}", started=True)
                tx.rms_messages.enqueue(key, payload("m"), action=ACTION, soap_version=SOAP12.ns,
                                        message_id=f"urn:uuid:m-{key}")
        with engine.store.begin() as tx:
            seq_a, seq_b = tx.rms.get("k-a"), tx.rms.get("k-b")
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
