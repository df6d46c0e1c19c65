"""A backlog must not get a sequence ended for inactivity, and a fault must never drop messages silently.

The destination ends a sequence it has heard nothing on for ``inactivity_timeout``.
A source with a large backlog over many sequences must therefore (a) serve
them round robin, not drain one while the others starve, and (b) send an
AckRequested on a sequence it cannot serve for a while, which the destination
counts as activity.  And when a source sequence does fault with messages
unacknowledged and nobody registered ``on_sequence_fault``, the messages stay
in the store (faulted), with an ERROR, instead of vanishing.
"""

from __future__ import annotations

import io
import logging
import re
import threading
import time

from wsrm_plugin.engine.transport import free_port

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for

INACTIVITY = 3.0  # a sequence silent this long is ended; generous, so a loaded machine is not "silent"
_APPLICATION_MESSAGE = re.compile(rb"<(\w+:)?Sequence[\s>]")


def _ended_for_inactivity(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no activity" in r.getMessage()]


def slow(delay: float):
    """A WSGI middleware: the server takes ``delay`` seconds over every request."""

    def wrap(app):
        def slow_app(environ, start_response):
            time.sleep(delay)
            return app(environ, start_response)
        return slow_app
    return wrap


def test_backlog_over_many_sequences_is_delivered_without_inactivity_ends(engines, caplog):
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    recorder = Recorder()
    server = engines("memory:", fast_policy(inactivity_timeout=INACTIVITY), serve=True,
                     middleware=slow(0.025), application=recorder)
    client = engines("memory:", fast_policy(inactivity_timeout=INACTIVITY, send_concurrency=1, send_batch=10))
    keys, per_key = 6, 30
    expected = [f"k{k}-{i}" for k in range(keys) for i in range(per_key)]
    for k in range(keys):  # key after key: oldest-first sending would leave the last keys waiting
        for i in range(per_key):
            client.send(server.endpoint_address, payload(f"k{k}-{i}"), action=ACTION, key=f"k{k}")

    assert wait_for(lambda: len(recorder.snapshot()) >= len(expected), timeout=120)
    assert wait_for(lambda: client.store.status().unacked == 0, timeout=30)
    assert _ended_for_inactivity(caplog) == []
    assert sorted(recorder.snapshot()) == sorted(expected)  # every message, exactly once
    for k in range(keys):  # in order within each sequence
        assert [t for t in recorder.snapshot() if t.startswith(f"k{k}-")] == [f"k{k}-{i}" for i in range(per_key)]
    assert client.status().faulted_sequences == 0


def test_a_sequence_that_cannot_send_is_kept_alive_with_ack_requested(engines, caplog):
    """Application messages are lost for twice the inactivity timeout; only AckRequested gets through."""
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    gate = threading.Event()
    reached: list[bytes] = []

    def lossy(app):
        def lossy_app(environ, start_response):
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            if not gate.is_set() and _APPLICATION_MESSAGE.search(body):
                start_response("503 Service Unavailable", [("Content-Length", "0")])
                return [b""]
            reached.append(body)
            environ["wsgi.input"] = io.BytesIO(body)
            return app(environ, start_response)
        return lossy_app

    recorder = Recorder()
    server = engines("memory:", fast_policy(inactivity_timeout=INACTIVITY), serve=True,
                     middleware=lossy, application=recorder)
    client = engines("memory:", fast_policy(inactivity_timeout=INACTIVITY, base_retransmission_interval=0.3))
    for i in range(3):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)

    assert wait_for(lambda: client.retransmission.keep_alives_sent >= 2, timeout=30)
    assert wait_for(lambda: time.sleep(0.1) or any(b"AckRequested" in b and not _APPLICATION_MESSAGE.search(b)
                                                   for b in reached), timeout=30)
    time.sleep(2 * INACTIVITY)  # the sequence would have been ended by now without the keep-alive
    assert _ended_for_inactivity(caplog) == []
    gate.set()
    assert wait_for(lambda: len(recorder.snapshot()) == 3, timeout=30)
    assert recorder.snapshot() == ["m0", "m1", "m2"]
    assert wait_for(lambda: client.store.status().unacked == 0, timeout=30)
    assert client.status().faulted_sequences == 0


def test_fault_without_hook_keeps_the_messages_and_logs_an_error(engines, caplog):
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    client = engines("memory:", fast_policy(max_retries=1, base_retransmission_interval=0.05))
    target = f"http://127.0.0.1:{free_port()}/"  # nobody listens: CreateSequence is never answered
    for i in range(3):
        client.send(target, payload(f"m{i}"), action=ACTION)

    def kept_error() -> bool:
        return any(r.levelno == logging.ERROR and "3 unacknowledged message(s)" in r.getMessage()
                   for r in caplog.records)

    assert wait_for(kept_error, timeout=30)
    time.sleep(0.5)  # several worker rounds: the sequence must stay
    [seq] = client.store.status().rms
    assert seq.state == "faulted" and seq.unacked == 3 and seq.stored == 3
    assert "no on_sequence_fault hook" in seq.fault_reason
    assert client.status().faulted_sequences == 1
    # reported once, not on every round
    assert sum(1 for r in caplog.records if "no on_sequence_fault hook" in r.getMessage()) == 1


def test_a_destination_does_not_count_its_own_downtime_as_the_sources_silence(engines, store_for):
    """Restarted after a stop longer than the inactivity timeout, a destination keeps its sequences:
    its timer runs from its start, so the sources' retransmissions find them still open."""
    from wsrm_plugin.store import open_store

    store = store_for("sqlite", "server")
    # twice the others' timeout: the look after a second and a half must come before it ends,
    # however long the loaded machine takes to start the engine and read its status
    inactivity = 2 * INACTIVITY
    policy = fast_policy(inactivity_timeout=inactivity)
    received = Recorder()
    first = engines(store, policy, serve=True, application=received, name="server")
    client = engines("memory:", policy, name="client")
    client.send(first.endpoint_address, payload("m0"), action=ACTION)
    assert wait_for(lambda: received.snapshot() == ["m0"])
    first.stop()
    with open_store(store) as stopped, stopped.begin() as tx:  # as after a stop of 10 timeouts
        [seq] = tx.rmd.list_all()
        tx.rmd.update(seq.sequence_id, last_activity=time.time() - 10 * inactivity)

    again = engines(store, policy, application=received, name="server-again")
    time.sleep(1.5)  # more than one housekeeping round
    [kept] = again.store.status().rmd
    assert kept.state == "receiving"
    # it still ends when the source really stays silent, counted from the restart (the engine's
    # own start, which came before this test could note the time: seen ended, it was no sooner)
    assert wait_for(lambda: again.store.status().rmd[0].state != "receiving", timeout=30)
    assert time.time() - again.acknowledgement.started_at >= inactivity


def test_a_last_activity_up_to_a_second_old_is_no_silence(engines):
    """A store writes a receipt's ``last_activity`` once a second at most (``ACTIVITY_GRAIN``), so
    the one stored may be that much behind the sequence's last message: the timeout counts from
    a grain after it, and a timeout below a second does not end a sequence that is receiving.
    (The stored time lies ahead of the clock, so the engine's own rounds never end it.)"""
    from wsrm_plugin.store.api.records import ACTIVITY_GRAIN

    engine = engines("memory:", fast_policy(inactivity_timeout=0.5))
    stamp = time.time() + 10_000.0
    with engine.store.begin() as tx:
        tx.rmd.create("s", acks_to="http://a", rm_version="urn:rm", wsa_version="urn:wsa")
        tx.rmd.update("s", last_activity=stamp)

    def ended() -> bool:
        with engine.store.begin() as tx:
            return tx.rmd.require("s").terminated

    engine.acknowledgement._housekeeping(stamp + 0.5 + ACTIVITY_GRAIN / 2)
    assert not ended()
    engine.acknowledgement._housekeeping(stamp + 0.5 + ACTIVITY_GRAIN)
    assert ended()
