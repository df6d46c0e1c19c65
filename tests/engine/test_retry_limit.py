"""Retry limits: a silent peer faults the sequence and the application is told what failed.

Until that moment every message stays in the store (the hook sees them
there); afterwards the faulted sequence is released, its messages handed
to the application in the report rather than silently lost.
"""

from __future__ import annotations

import threading

from wsrm_plugin.engine import SequenceFault
from wsrm_plugin.engine.transport import free_port

from .conftest import fast_policy
from .support import ACTION, Recorder, item_text, payload, wait_for


class FaultHook:
    def __init__(self, engine_ref: list) -> None:
        self.reports: list[SequenceFault] = []
        self.stored_at_report: list[int] = []
        self._engine_ref = engine_ref
        self.called = threading.Event()

    def __call__(self, report: SequenceFault) -> None:
        # the hook runs before the release: the store must still hold every message
        status = self._engine_ref[0].store.status()
        self.stored_at_report.append(sum(s.unacked for s in status.rms if s.key == report.sequence_key))
        self.reports.append(report)
        self.called.set()


def test_server_down_from_the_start_faults_after_max_retries(engines, store_for):
    ref: list = []
    hook = FaultHook(ref)
    policy = fast_policy(max_retries=2, base_retransmission_interval=0.05)
    client = engines(store_for("sqlite", "client"), policy, on_sequence_fault=hook)
    ref.append(client)
    target = f"http://127.0.0.1:{free_port()}/"
    for i in range(3):
        client.send(target, payload(f"m{i}"), action=ACTION)
    assert client.store.status().unacked == 3

    assert hook.called.wait(30)
    [report] = hook.reports
    assert report.target == target and report.sequence_id is None
    assert "no answer to create sequence after 3 attempts" in report.reason
    assert [item_text(m.payload) for m in report.messages] == ["m0", "m1", "m2"]
    assert [m.number for m in report.messages] == [1, 2, 3]
    assert hook.stored_at_report == [3]
    assert wait_for(lambda: not client.store.status().rms, timeout=10)
    status = client.status()
    assert status.faulted_sequences == 1 and status.send_failures == 3

    # a new message to the same target starts a new sequence (and fails the same way)
    client.send(target, payload("m3"), action=ACTION)
    assert wait_for(lambda: len(hook.reports) == 2, timeout=30)
    assert [item_text(m.payload) for m in hook.reports[1].messages] == ["m3"]


def test_server_lost_midway_reports_only_the_unacknowledged_messages(engines, store_for):
    ref: list = []
    hook = FaultHook(ref)
    received = Recorder()
    policy = fast_policy(max_retries=3, base_retransmission_interval=0.05)
    server = engines(store_for("memory", "server"), policy, serve=True, application=received, name="server")
    client = engines(store_for("memory", "client"), policy, on_sequence_fault=hook, name="client")
    ref.append(client)
    target = server.endpoint_address
    for i in range(3):
        client.send(target, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: client.status().unacked == 0 and received.snapshot() == ["m0", "m1", "m2"])

    server.stop()
    client.send(target, payload("m3"), action=ACTION)
    client.send(target, payload("m4"), action=ACTION)
    assert hook.called.wait(30)
    [report] = hook.reports
    assert "unacknowledged after 4 transmissions" in report.reason
    assert [(m.number, item_text(m.payload)) for m in report.messages] == [(4, "m3"), (5, "m4")]
    assert hook.stored_at_report == [2]
    assert wait_for(lambda: not client.store.status().rms, timeout=10)
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == ["m0", "m1", "m2"]), received.snapshot()


def test_no_retry_limit_keeps_trying_until_the_server_comes_back(engines, store_for):
    received = Recorder()
    policy = fast_policy(base_retransmission_interval=0.05)
    port = free_port()
    client = engines(store_for("memory", "client"), policy, name="client")
    target = f"http://127.0.0.1:{port}/"
    client.send(target, payload("patient"), action=ACTION)
    assert wait_for(lambda: client.status().send_failures >= 5, timeout=30)

    server = engines(store_for("memory", "server"), policy, application=received, name="server")
    server.serve(port=port)
    client.close(target)
    assert wait_for(lambda: not client.store.status().rms, timeout=30), client.status()
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == ["patient"]), received.snapshot()
    assert client.status().faulted_sequences == 0


def test_a_refused_create_sequence_faults_at_once(engines, store_for):
    ref: list = []
    hook = FaultHook(ref)
    server = engines(store_for("memory", "server"), fast_policy(max_open_sequences=1), serve=True,
                     application=Recorder(), name="server")
    client = engines(store_for("memory", "client"), on_sequence_fault=hook, name="client")
    ref.append(client)
    target = server.endpoint_address
    client.send(target, payload("first"), action=ACTION, key="one")
    assert wait_for(lambda: client.status().unacked == 0)
    client.send(target, payload("second"), action=ACTION, key="two")
    assert hook.called.wait(30)
    [report] = hook.reports
    assert report.reason.startswith(f"CreateSequence refused by {target}") and "CreateSequenceRefused" in report.reason
    assert report.refused
    assert [item_text(m.payload) for m in report.messages] == ["second"]
