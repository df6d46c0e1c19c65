"""WS-Policy-driven engagement, end to end: a real spyne service publishes its WS-RM policy in its
WSDL, a zeep client made reliable without any option reads it and speaks what it says (real HTTP)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zeep
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

from interceptors.wsdl import RMPolicyAssertion
from wsrm_plugin import RMPolicy, reliable_client, reliable_service
from wsrm_plugin.engine.transport import HttpServer
from wsrm_plugin.wire import RM10, RM11

TNS = "urn:wsrm-policy-engagement-test"
RM10_NS = b"http://schemas.xmlsoap.org/ws/2005/02/rm"
RM11_NS = b"http://docs.oasis-open.org/ws-rx/wsrm/200702"
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05, http_timeout=5.0)

_lock = threading.Lock()
RECORDED: list[str] = []


class NoteService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def note(ctx, text):  # noqa: N805 -- spyne's signature
        with _lock:
            RECORDED.append(text)

    @rpc(Unicode, _returns=Unicode)
    def shout(ctx, text):  # noqa: N805
        return text.upper()


class WireRecorder:
    """WSGI middleware noting which WS-RM namespace each POSTed envelope carries."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.versions: list[str] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("REQUEST_METHOD") == "POST":
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            with _lock:
                if RM10_NS + b'"' in body or RM10_NS + b"/" in body:
                    self.versions.append("1.0")
                if RM11_NS in body:
                    self.versions.append("1.1")
        return self.app(environ, start_response)


@pytest.fixture
def service_factory() -> Iterator[Any]:
    made: list[tuple[Any, HttpServer]] = []

    def make(policy: RMPolicy, **options: Any) -> tuple[Any, WireRecorder, str]:
        app = Application([NoteService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())
        service = reliable_service(app, "memory:", policy, **options)
        recorder = WireRecorder(service)
        server = HttpServer(recorder).start()
        service.engine.endpoint_address = server.url
        made.append((service.start(), server))
        return service, recorder, server.url

    with _lock:
        RECORDED.clear()
    yield make
    for service, server in reversed(made):
        server.stop(5)
        service.stop(5)


def _wait(predicate: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _exchange(url: str, **options: Any) -> Any:
    rc = reliable_client(zeep.Client(url + "?wsdl"), "memory:", **options)
    try:
        for i in range(5):
            rc.service.note(f"n{i}")
        assert rc.service.shout("hi").result(timeout=30) == "HI"
        assert _wait(lambda: RECORDED == [f"n{i}" for i in range(5)]), RECORDED
    finally:
        rc.stop(timeout=5)
    return rc


def test_a_service_publishing_ws_rm_1_0_is_spoken_to_in_1_0_without_any_option(service_factory):
    _, recorder, url = service_factory(RMPolicy(rm_version="1.0", soap_version="1.1", **FAST))
    rc = _exchange(url)  # no policy at all: RMPolicy() says 1.1
    assert rc.engine.policy.rm_version is RM10
    assert "1.0" in recorder.versions and "1.1" not in recorder.versions, recorder.versions


def test_a_service_publishing_1_1_is_spoken_to_in_1_1(service_factory):
    _, recorder, url = service_factory(RMPolicy(rm_version="1.1", soap_version="1.1", **FAST))
    rc = _exchange(url, policy=RMPolicy(**FAST))
    assert rc.engine.policy.rm_version is RM11
    assert "1.1" in recorder.versions and "1.0" not in recorder.versions, recorder.versions


def test_without_wsdl_policy_the_client_keeps_its_own_version(service_factory):
    _, _, url = service_factory(RMPolicy(rm_version="1.0", soap_version="1.1", **FAST))
    rc = reliable_client(zeep.Client(url + "?wsdl"), "memory:", RMPolicy(**FAST), wsdl_policy=False, start=False)
    assert rc.engine.policy.rm_version is RM11
    rc.stop(timeout=5)


def test_what_the_user_sets_explicitly_wins_over_the_wsdl(service_factory):
    published = RMPolicyAssertion(version=RM10, inactivity_timeout_ms=90_000,
                                  base_retransmission_interval_ms=700, exponential_backoff=True,
                                  acknowledgement_interval_ms=40)
    _, _, url = service_factory(RMPolicy(rm_version="1.0", soap_version="1.1", **FAST),
                                publish_policy=published)
    rc = reliable_client(zeep.Client(url + "?wsdl"), "memory:", RMPolicy(rm_version="1.1", poll_interval=0.05,
                                                                         base_retransmission_interval=0.3),
                         start=False)
    try:
        policy = rc.engine.policy
        assert policy.rm_version is RM11                     # explicit
        assert policy.base_retransmission_interval == 0.3    # explicit
        assert policy.inactivity_timeout == 90.0             # from the WSDL
        assert policy.exponential_backoff is True            # from the WSDL
        assert policy.acknowledgement_interval == 0.04       # from the WSDL
    finally:
        rc.stop(timeout=5)


def test_the_timers_of_a_1_0_assertion_configure_the_client(service_factory):
    published = RMPolicyAssertion(version=RM10, inactivity_timeout_ms=120_000,
                                  base_retransmission_interval_ms=250, acknowledgement_interval_ms=100)
    _, recorder, url = service_factory(RMPolicy(rm_version="1.0", soap_version="1.1", **FAST),
                                       publish_policy=published)
    rc = _exchange(url, policy=RMPolicy(poll_interval=0.05, exponential_backoff=False))
    policy = rc.engine.policy
    assert policy.rm_version is RM10
    assert (policy.inactivity_timeout, policy.base_retransmission_interval,
            policy.acknowledgement_interval) == (120.0, 0.25, 0.1)
    assert policy.exponential_backoff is False               # explicit, and the WSDL did not ask
    assert "1.1" not in recorder.versions
