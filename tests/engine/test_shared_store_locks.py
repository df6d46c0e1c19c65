"""Engines sharing a PostgreSQL store: rows taken in one order, each engine sending its own sequences.

Worker processes, or several clients in one process, share a store and
claim each other's sequences, so two engines' rounds may settle the same
sequences.  Each taking the rows in the order its round met them deadlocked
(four client engines on one store: PostgreSQL chose a caller's enqueue as
the victim, and the call failed).
"""

from __future__ import annotations

import re
import threading
import time

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.store import open_store
from wsrm_plugin.wire.namespaces import RM11, SOAP12, WSA_2005_08 as WSA10

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for


def _served() -> tuple[ReliableEngine, Recorder]:
    """A started, served engine (memory store) and what its application received."""
    received = Recorder()
    server = ReliableEngine("memory:", fast_policy(), application=received, name="server")
    server.serve()
    server.start()
    return server, received


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


class _Recording:
    """The engine's HTTP transport, noting the sequence of every message it sends."""

    def __init__(self, policy) -> None:
        from wsrm_plugin.engine.transport import HttpTransport

        self._inner = HttpTransport(timeout=policy.http_timeout)
        self.sequences: list[str] = []

    def send(self, address, envelope, headers):
        found = _IDENTIFIER.search(envelope)
        if found and _SEQUENCE.search(envelope):
            self.sequences.append(found.group(1).decode())
        return self._inner.send(address, envelope, headers)

    def close(self) -> None:
        self._inner.close()


_IDENTIFIER = re.compile(rb"<(?:\w+:)?Identifier>([^<]+)</")
_SEQUENCE = re.compile(rb"<(\w+:)?Sequence[\s>]")


def test_engines_sharing_a_store_each_send_their_own_sequences(pg_dsn_factory) -> None:
    """Each engine's sender claims every due message (so one takes over what another leaves), but
    its own sequences' at once and the others' only after a retransmission interval: two engines
    sending one sequence at once delivered it out of order (a third of the messages buffered)."""
    url = "postgresql:" + pg_dsn_factory("home")
    server, received = _served()
    policy = fast_policy(base_retransmission_interval=2.0)
    transports = [_Recording(policy) for _ in range(2)]
    engines = [ReliableEngine(url, policy, transport=transports[n], name=f"client{n}").start() for n in range(2)]
    try:
        def calls(n: int) -> None:
            for i in range(40):
                engines[n].send(server.endpoint_address, payload(f"e{n}-{i}"), action=ACTION, key=f"k{n}")

        threads = [threading.Thread(target=calls, args=(n,)) for n in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wait_for(lambda: len(received.snapshot()) == 80, timeout=30), len(received.snapshot())
        with engines[0].store.begin() as tx:
            ids = {seq.key: seq.sequence_id for seq in tx.rms.list_all()}
        own = [{i for k, i in ids.items() if f'"k{n}"' in k} for n in range(2)]
        assert all(len(o) == 1 for o in own), ids
        for n in range(2):  # nothing of the other engine's sequence
            assert set(transports[n].sequences) == own[n], (n, set(transports[n].sequences), own)
    finally:
        for engine in engines:
            engine.stop(timeout=5)
        server.stop(timeout=5)


def test_an_engine_takes_over_the_messages_another_left_once_they_waited(pg_dsn_factory) -> None:
    url = "postgresql:" + pg_dsn_factory("takeover")
    server, received = _served()
    policy = fast_policy(base_retransmission_interval=1.0)
    gone = ReliableEngine(url, policy, name="gone")  # never started: what it enqueues, it never sends
    stays = ReliableEngine(url, policy, name="stays").start()
    try:
        stays.send(server.endpoint_address, payload("own"), action=ACTION, key="mine")  # it has a home
        assert wait_for(lambda: received.snapshot() == ["own"], timeout=30)
        for i in range(3):
            gone.send(server.endpoint_address, payload(f"left-{i}"), action=ACTION, key="theirs")
        # the other engine's sequence: created and sent by the one that stays, after waiting
        assert wait_for(lambda: len(received.snapshot()) == 4, timeout=30), received.snapshot()
        assert received.snapshot()[1:] == ["left-0", "left-1", "left-2"]
    finally:
        stays.stop(timeout=5)
        gone.stop(timeout=5)
        server.stop(timeout=5)


def test_after_a_restart_the_lifecycle_listener_gives_the_engine_its_own_sequences_back(tmp_path) -> None:
    """A restarted engine has enqueued nothing yet: its sequences of before are its own again
    (sent at once, not after another engine's wait), those of keys no longer in use are not."""
    from wsrm_plugin.lifecycle import LifecycleListener

    url = f"sqlite:///{tmp_path}/client.db"
    before = ReliableEngine(url, fast_policy(), name="before")  # never started: nothing is sent
    mine = before.send("http://127.0.0.1:9/", payload("a"), action=ACTION, key="mine").sequence_key
    before.send("http://127.0.0.1:9/", payload("b"), action=ACTION, key="gone")
    before.stop(timeout=5)
    after = ReliableEngine(url, fast_policy(), name="after")
    try:
        assert after.source.home_keys() == []
        LifecycleListener(after, active_keys={"mine"}).on_start()
        assert after.source.home_keys() == [mine]
    finally:
        after.stop(timeout=5)
