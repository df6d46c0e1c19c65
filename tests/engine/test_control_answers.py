"""How the source takes the answers a destination may give to a retried Close or Terminate.

A Close or Terminate whose response was lost goes out again, and the
destination may by then have closed or forgotten the sequence: gSOAP 2.8
answers a retried 1.1 TerminateSequence with a bare 202, others fault with
SequenceClosed or UnknownSequence.  None of these may leave the sequence in
the store for ever, or fault it: both are only sent once every message is
acknowledged.  The destination here is a real engine behind a WSGI
middleware that plays those answers for the control message under test.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import pytest

from wsrm_plugin.engine import RMPolicy
from wsrm_plugin.wire import RM11, SOAP12, fault_envelope, to_bytes
from wsrm_plugin.wire.faults import SequenceClosed, SoapFault, UnknownSequence

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for

#: One scripted answer: "forward" (the real destination answers), "lost" (the real
#: destination handles it, its answer never arrives), "202", or a fault to send.
Answer = str | SoapFault


class ControlScript:
    """WSGI middleware: the n-th request carrying ``element`` gets ``answers[n]`` (the last repeats)."""

    def __init__(self, element: bytes, answers: list[Answer]) -> None:
        self.element = element
        self.answers = answers
        self.seen = 0
        self._lock = threading.Lock()

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length)
            environ["wsgi.input"] = io.BytesIO(body)
            if self.element not in body:
                return app(environ, start_response)
            with self._lock:
                answer = self.answers[min(self.seen, len(self.answers) - 1)]
                self.seen += 1
            if answer == "forward":
                return app(environ, start_response)
            if answer == "lost":
                b"".join(app(environ, lambda *a, **k: None))  # handled, but the answer is lost
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"the answer was lost on the way\n"]
            if answer == "202":
                start_response("202 Accepted", [("Content-Length", "0")])
                return [b""]
            data = to_bytes(fault_envelope(answer, SOAP12))
            start_response("500 Internal Server Error",
                           [("Content-Type", "application/soap+xml; charset=utf-8"),
                            ("Content-Length", str(len(data)))])
            return [data]

        return middleware


def _run(engines, policy: RMPolicy, script: ControlScript) -> tuple[Any, Any, Recorder]:
    received = Recorder()
    server = engines("memory:", policy, serve=True, middleware=script, application=received, name="server")
    client = engines("memory:", policy, name="client")
    for i in range(3):
        client.send(server.endpoint_address, payload(f"m{i}"), action=ACTION)
    assert wait_for(lambda: client.status().unacked == 0), client.status()
    assert client.close(server.endpoint_address) == 1
    return client, server, received


def _released_without_fault(client: Any, received: Recorder) -> None:
    assert wait_for(lambda: client.status().rms_sequences == 0, timeout=20), client.status()
    assert client.status().faulted_sequences == 0
    # a buffered message is delivered after its acknowledgement: wait for the delivery
    assert wait_for(lambda: received.snapshot() == ["m0", "m1", "m2"]), received.snapshot()


def test_a_bare_202_to_a_retried_1_1_terminate_releases_the_sequence(engines):
    script = ControlScript(b"TerminateSequence>", ["lost", "202"])
    client, server, received = _run(engines, fast_policy(rm_version="1.1"), script)
    _released_without_fault(client, received)
    assert script.seen == 2
    assert wait_for(lambda: not server.store.status().rmd)  # the first one did terminate it


def test_a_1_1_terminate_answered_with_a_fault_goes_out_again(engines):
    """A SOAP fault that is not about the sequence is no answer: Terminate is retried."""
    script = ControlScript(b"TerminateSequence>", [SoapFault("busy", code="Receiver"), "forward"])
    client, _, received = _run(engines, fast_policy(rm_version="1.1"), script)
    _released_without_fault(client, received)
    assert script.seen == 2


@pytest.mark.parametrize("answer", [SequenceClosed(version=RM11), "forward"], ids=["SequenceClosed", "again"])
def test_a_retried_close_that_finds_the_sequence_closed_goes_on_to_terminate(engines, answer):
    script = ControlScript(b"CloseSequence>", ["lost", answer])
    client, server, received = _run(engines, fast_policy(rm_version="1.1"), script)
    _released_without_fault(client, received)
    assert script.seen == 2
    assert wait_for(lambda: not server.store.status().rmd)  # Terminate followed, and ended it


def test_a_retried_close_that_finds_the_sequence_gone_releases_it(engines):
    script = ControlScript(b"CloseSequence>", ["lost", UnknownSequence(version=RM11)])
    client, _, received = _run(engines, fast_policy(rm_version="1.1"), script)
    _released_without_fault(client, received)
    assert script.seen == 2


@pytest.mark.parametrize("rm_version", ["1.0", "1.1"])
def test_an_unanswered_terminate_is_given_up_after_max_terminate_attempts(engines, rm_version):
    script = ControlScript(b"TerminateSequence>", ["lost"])
    policy = fast_policy(rm_version=rm_version, max_terminate_attempts=3)
    client, _, received = _run(engines, policy, script)
    _released_without_fault(client, received)
    assert script.seen == 3


def test_max_terminate_attempts_must_be_positive():
    with pytest.raises(ValueError, match="max_terminate_attempts"):
        fast_policy(max_terminate_attempts=0)
