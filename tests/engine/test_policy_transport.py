"""RMPolicy validation and backoff; HttpTransport and the endpoint's HTTP behaviour."""

from __future__ import annotations

import threading

import pytest

from wsrm_plugin.engine import (
    AckRequestMode, BasicAuth, DeliveryAssurance, HttpServer, HttpTransport, RMPolicy, TransportError,
)
from wsrm_plugin.engine.transport import free_port
from wsrm_plugin.wire import RM10, RM11, SOAP11, WSA_2004_08, WSA_2005_08

from .support import post


def test_policy_defaults_pair_versions_like_real_peers():
    policy = RMPolicy()
    assert policy.rm_version is RM11 and policy.addressing is WSA_2005_08
    assert policy.delivery == DeliveryAssurance.EXACTLY_ONCE | DeliveryAssurance.IN_ORDER
    assert policy.in_order and policy.retransmits
    old = RMPolicy(rm_version="1.0", soap_version="1.1")
    assert old.rm_version is RM10 and old.addressing is WSA_2004_08 and old.soap_version is SOAP11
    assert RMPolicy(rm_version="1.0", wsa_version="2005/08").addressing is WSA_2005_08
    # replacing the version re-derives its addressing partner
    assert RMPolicy().replace(rm_version=RM10).addressing is WSA_2004_08


def test_backoff_doubles_up_to_the_cap():
    policy = RMPolicy(base_retransmission_interval=1.0, max_retransmission_interval=5.0)
    assert [policy.retry_delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    flat = RMPolicy(base_retransmission_interval=1.0, exponential_backoff=False)
    assert [flat.retry_delay(n) for n in (1, 2, 10)] == [1.0, 1.0, 1.0]
    assert RMPolicy(max_retries=2).retries_exhausted(3) and not RMPolicy(max_retries=2).retries_exhausted(2)
    assert not RMPolicy().retries_exhausted(10_000)


@pytest.mark.parametrize("bad,match", [
    (dict(rm_version="2.0"), "rm_version"),
    (dict(wsa_version="2003/03"), "wsa_version"),
    (dict(base_retransmission_interval=0), "base_retransmission_interval"),
    (dict(base_retransmission_interval=10, max_retransmission_interval=5), "max_retransmission_interval"),
    (dict(max_retries=-1), "max_retries"),
    (dict(max_unacknowledged=0), "max_unacknowledged"),
    (dict(max_open_sequences=0), "max_open_sequences"),
    (dict(acknowledgement_interval=-1), "acknowledgement_interval"),
    (dict(delivery_batch_seconds=0), "delivery_batch_seconds"),
    (dict(delivery=DeliveryAssurance.IN_ORDER), "AT_MOST_ONCE"),
    (dict(ack_request="sometimes"), "sometimes"),
])
def test_policy_refuses_nonsense(bad, match):
    with pytest.raises(ValueError, match=match):
        RMPolicy(**bad)


def test_ack_request_by_name():
    assert RMPolicy(ack_request="always").ack_request is AckRequestMode.ALWAYS


def _echo(environ, start_response):
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Length", str(len(body))), ("X-Port", environ["REMOTE_PORT"])])
    return [body]


def test_http_transport_keeps_its_connection_alive_for_the_next_request_of_any_thread():
    with HttpServer(_echo) as server:
        transport = HttpTransport(timeout=5)
        try:
            ports = {transport.send(server.url, b"x%d" % i, {}).headers["X-Port"] for i in range(5)}
            assert len(ports) == 1  # keep-alive: every request on the same client port
            other: list[str] = []
            thread = threading.Thread(target=lambda: other.append(transport.send(server.url, b"y", {}).headers["X-Port"]))
            thread.start()
            thread.join()
            assert other and other[0] in ports  # another thread, after: the idle connection
            assert transport.send(server.url, b"echo", {}).body == b"echo"
        finally:
            transport.close()


def test_http_transport_errors_are_transport_errors():
    transport = HttpTransport(timeout=2)
    with pytest.raises(TransportError, match="refused|Errno"):
        transport.send(f"http://127.0.0.1:{free_port()}/", b"x", {})
    with pytest.raises(TransportError, match="only http"):
        transport.send("ftp://127.0.0.1/", b"x", {})
    with pytest.raises(ValueError):
        HttpTransport(timeout=0)


def test_http_transport_recovers_from_a_server_restart_on_the_same_port():
    server = HttpServer(_echo).start()
    port = server.port
    transport = HttpTransport(timeout=5)
    try:
        assert transport.send(server.url, b"before", {}).body == b"before"
        server.stop()
        server = HttpServer(_echo, port=port).start()
        assert transport.send(server.url, b"after", {}).body == b"after"  # stale connection replaced
    finally:
        transport.close()
        server.stop()


def test_basic_auth_middleware():
    seen: list[str | None] = []

    def app(environ, start_response):
        seen.append(environ.get("REMOTE_USER"))
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    with HttpServer(BasicAuth(app, {"alice": "s3cret"})) as server:
        assert post(server.url, b"x").status == 401
        assert post(server.url, b"x", headers={"Authorization": "Basic !!!"}).status == 401
        import base64
        wrong = base64.b64encode(b"alice:guess").decode()
        assert post(server.url, b"x", headers={"Authorization": f"Basic {wrong}"}).status == 401
        right = base64.b64encode(b"alice:s3cret").decode()
        assert post(server.url, b"x", headers={"Authorization": f"Basic {right}"}).status == 200
    assert seen == ["alice"]


def test_stopping_a_server_leaves_no_thread_behind():
    before = {t.name for t in threading.enumerate()}
    server = HttpServer(_echo).start()
    post(server.url, b"x")
    server.stop()
    after = {t.name for t in threading.enumerate()}
    assert after <= before


def test_http_transport_refuses_an_endless_response():
    def huge(environ, start_response):
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Length", str(10_000))])
        return [b"x" * 10_000]

    with HttpServer(huge) as server:
        strict, lenient = HttpTransport(timeout=5, max_response_size=1000), HttpTransport(timeout=5)
        try:
            with pytest.raises(TransportError, match="exceeds 1000 bytes"):
                strict.send(server.url, b"x", {})
            assert lenient.send(server.url, b"x", {}).body == b"x" * 10_000
        finally:
            strict.close()
            lenient.close()
