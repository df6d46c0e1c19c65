"""The lossy proxy against a real HTTP/1.1 target on 127.0.0.1 that records what it got.

Every fault decision comes from a seeded RNG and the clients here send one
request at a time, so the outcomes are the same on every run; the statistical
bounds below hold for the seed used and would catch a proxy that ignores its
probabilities.
"""

from __future__ import annotations

import http.client
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from wsrm_plugin.tools import proxy as proxy_mod
from wsrm_plugin.tools.proxy import LossyProxy, NotLoopbackError, ProxiedRequest

pytestmark = pytest.mark.timeout(120)

CONNECTION_ERRORS = (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine)


class Target:
    """A tiny HTTP/1.1 server that records every request and echoes POST bodies."""

    WSDL = ('<?xml version="1.0"?><definitions xmlns="http://schemas.xmlsoap.org/wsdl/">'
            '<service><port><address location="{base}/svc"/></port></service></definitions>')

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []
        target = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True
            timeout = 30

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with target.lock:
                    target.requests.append((self.command, self.path, body, dict(self.headers)))
                self._reply(200, b"echo:" + body, "text/plain")

            def do_GET(self) -> None:
                with target.lock:
                    target.requests.append((self.command, self.path, b"", dict(self.headers)))
                self._reply(200, Target.WSDL.format(base=target.base).encode(), "text/xml")

            def _reply(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self.url = self.base + "/svc"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [body for method, _, body, _ in self.requests if method == "POST"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def target() -> Iterator[Target]:
    t = Target()
    try:
        yield t
    finally:
        t.close()


class Client:
    """One keep-alive connection to the proxy; reconnects after the proxy cut it."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname, parts.port, parts.path
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def post(self, body: bytes, path: str | None = None) -> tuple[int, bytes] | None:
        """(status, body), or None when the connection went away without a response."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", path or self.path, body=body,
                              headers={"Content-Type": "text/xml"})
            resp = self.conn.getresponse()
            return resp.status, resp.read()
        except CONNECTION_ERRORS:
            self.close()
            return None

    def get(self, path: str) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        return resp.status, resp.read()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def messages(n: int, tag: str = "m") -> list[bytes]:
    return [f"<{tag}>{i}</{tag}>".encode() for i in range(n)]


# --------------------------------------------------------------------------- #


def test_clean_proxy_passes_everything_through_on_one_connection(target: Target) -> None:
    with LossyProxy(target.url, seed=1) as proxy:
        assert proxy.url == f"http://127.0.0.1:{proxy.port}/svc"
        client = Client(proxy.url)
        answers = [client.post(body) for body in messages(20)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    assert answers == [(200, b"echo:" + body) for body in messages(20)]
    assert target.bodies() == messages(20)
    assert stats.received == stats.forwarded == 20
    assert stats.dropped == stats.duplicated == stats.reordered == stats.failed == 0
    # one client connection, kept alive, became one pooled target connection
    with target.lock:
        agents = {r[3].get("Host") for r in target.requests}
    assert agents == {target.base.removeprefix("http://")}


@pytest.mark.parametrize("mode", ["close", "502", "timeout"])
def test_drop_everything_target_gets_nothing(target: Target, mode: str) -> None:
    with LossyProxy(target.url, drop=1.0, seed=2, drop_mode=mode, drop_timeout=0.2) as proxy:
        client = Client(proxy.url)
        answers = [client.post(body) for body in messages(5)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    if mode == "502":
        assert [a[0] for a in answers] == [502] * 5
    else:
        assert answers == [None] * 5  # the client saw the connection go away
    assert target.bodies() == []
    assert stats.dropped == stats.received == 5
    assert stats.forwarded == 0


def test_drop_response_target_acts_but_client_sees_error(target: Target) -> None:
    with LossyProxy(target.url, drop_response=1.0, seed=3) as proxy:
        client = Client(proxy.url)
        answers = [client.post(body) for body in messages(4)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    assert answers == [None] * 4
    assert target.bodies() == messages(4)
    assert stats.responses_dropped == stats.forwarded == 4
    assert stats.dropped == 0


def test_duplicate_everything_target_gets_each_body_twice(target: Target) -> None:
    with LossyProxy(target.url, duplicate=1.0, seed=4) as proxy:
        client = Client(proxy.url)
        answers = [client.post(body) for body in messages(10)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    assert answers == [(200, b"echo:" + body) for body in messages(10)]  # first response
    assert Counter(target.bodies()) == Counter({body: 2 for body in messages(10)})
    assert stats.duplicated == 10
    assert stats.forwarded == 20


def _reorder_run(target: Target, seed: int) -> tuple[list[bytes], list[int], object]:
    start = len(target.bodies())
    # A long hold: held requests are released only by the window (and the final
    # drain), so the order depends on the seed alone, not on timing.
    with LossyProxy(target.url, reorder=0.3, reorder_window=2, reorder_hold=60,
                    seed=seed) as proxy:
        client = Client(proxy.url)
        statuses = [client.post(body)[0] for body in messages(40)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    return target.bodies()[start:], statuses, stats


def test_reorder_target_sees_a_seeded_permutation(target: Target) -> None:
    seen, statuses, stats = _reorder_run(target, seed=7)
    assert sorted(seen) == sorted(messages(40))  # nothing lost, nothing doubled
    assert seen != messages(40)  # but not in the order sent
    assert statuses.count(202) == stats.reordered > 0
    assert statuses.count(200) == 40 - stats.reordered
    # each held request reached the target after later ones had overtaken it
    sent = messages(40)
    held = [sent[i] for i, s in enumerate(statuses) if s == 202]
    for body in held:
        later = set(sent[sent.index(body) + 1:])
        if later:
            assert later & set(seen[:seen.index(body)]), body
    # the same seed gives the same order
    again, statuses_again, _ = _reorder_run(target, seed=7)
    assert (again, statuses_again) == (seen, statuses)


def test_reorderable_predicate_keeps_in_out_requests_synchronous(target: Target) -> None:
    def one_way_only(request: ProxiedRequest) -> bool:
        return b"inout" not in request.body

    bodies = [f"<{'inout' if i % 2 else 'oneway'}>{i}</x>".encode() for i in range(10)]
    with LossyProxy(target.url, reorder=1.0, reorder_hold=60, reorderable=one_way_only,
                    seed=8) as proxy:
        client = Client(proxy.url)
        answers = [client.post(body) for body in bodies]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    for body, answer in zip(bodies, answers):
        if b"inout" in body:
            assert answer == (200, b"echo:" + body)  # response passed through
        else:
            assert answer == (202, b"")
    assert stats.reordered == 5
    assert sorted(target.bodies()) == sorted(bodies)


def test_zeep_and_spyne_through_the_proxy() -> None:
    """A real client loads the WSDL through the proxy and its calls go through it too."""
    import waitress
    import zeep
    from spyne import Application, Integer, ServiceBase, rpc
    from spyne.protocol.soap import Soap11
    from spyne.server.wsgi import WsgiApplication

    calls: list[int] = []

    class Calc(ServiceBase):
        @rpc(Integer, _returns=Integer)
        def double(ctx, n):  # noqa: N805 -- spyne's signature
            calls.append(n)
            return 2 * n

    app = WsgiApplication(Application([Calc], "urn:proxy-test", in_protocol=Soap11(),
                                      out_protocol=Soap11()))
    server = waitress.create_server(app, host="127.0.0.1", port=0, threads=2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.effective_port}/"
        with LossyProxy(url, duplicate=1.0, seed=1) as proxy:
            client = zeep.Client(proxy.url + "?wsdl")
            results = [client.service.double(n) for n in (1, 2, 3)]
            assert proxy.drain()
            stats = proxy.stats
    finally:
        server.close()
        thread.join(10)
    assert results == [2, 4, 6]
    assert sorted(calls) == [1, 1, 2, 2, 3, 3]  # the posts went through the proxy
    assert stats.received == 3 and stats.duplicated == 3 and stats.passed_through >= 1


def test_drop_rate_over_500_requests(target: Target) -> None:
    with LossyProxy(target.url, drop=0.2, seed=2024) as proxy:
        client = Client(proxy.url)
        answers = [client.post(body) for body in messages(500)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    lost = answers.count(None)
    assert 75 <= lost <= 125, lost
    assert stats.dropped == lost
    delivered = [body for body, answer in zip(messages(500), answers) if answer is not None]
    assert target.bodies() == delivered
    assert stats.forwarded == 500 - lost


def test_same_seed_same_decisions(target: Target) -> None:
    def run() -> list[object]:
        with LossyProxy(target.url, drop=0.3, seed=99, drop_mode="502") as proxy:
            client = Client(proxy.url)
            statuses = [client.post(body)[0] for body in messages(30)]
            client.close()
        return statuses

    first = run()
    assert first == run()
    assert 502 in first and 200 in first


def test_delays_are_applied(target: Target) -> None:
    with LossyProxy(target.url, delay=(0.05, 0.1), seed=5) as proxy:
        client = Client(proxy.url)
        started = time.monotonic()
        answers = [client.post(body) for body in messages(6)]
        elapsed = time.monotonic() - started
        client.close()
        stats = proxy.stats
    assert answers == [(200, b"echo:" + body) for body in messages(6)]
    assert stats.delayed == 6
    assert elapsed >= 6 * 0.05  # a lower bound only: each request waited at least 50 ms
    assert target.bodies() == messages(6)


def test_counters_match_what_the_target_saw(target: Target) -> None:
    with LossyProxy(target.url, drop=0.1, duplicate=0.1, reorder=0.1, drop_response=0.1,
                    drop_mode="502", reorder_window=2, reorder_hold=60, seed=11) as proxy:
        client = Client(proxy.url)
        answers = [client.post(body) for body in messages(200)]
        client.close()
        assert proxy.drain()
        stats = proxy.stats
    seen = target.bodies()
    statuses = Counter(status for status, _ in answers)
    assert stats.received == 200
    assert stats.forwarded == len(seen)
    assert stats.forwarded == (stats.received - stats.dropped + stats.duplicated
                               - stats.failed - stats.discarded)
    assert statuses[202] == stats.reordered
    assert statuses[502] == stats.dropped + stats.responses_dropped
    assert len(seen) - len(set(seen)) == stats.duplicated
    assert min(stats.dropped, stats.duplicated, stats.reordered, stats.responses_dropped) > 0
    assert stats.failed == stats.discarded == 0


def test_stop_without_flush_discards_held_requests(target: Target) -> None:
    proxy = LossyProxy(target.url, reorder=1.0, reorder_hold=60, seed=6).start()
    try:
        client = Client(proxy.url)
        assert [client.post(body)[0] for body in messages(3)] == [202] * 3
        client.close()
    finally:
        proxy.stop(flush=False)
    assert target.bodies() == []
    assert proxy.stats.discarded == 3


def test_target_down_gives_502_and_counts_failure() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on once it is closed
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with LossyProxy(f"http://127.0.0.1:{dead_port}/svc", seed=1) as proxy:
        client = Client(proxy.url)
        status, body = client.post(b"<x/>")
        client.close()
        stats = proxy.stats
    assert status == 502 and b"cannot reach the target" in body
    assert stats.failed == 1 and stats.forwarded == 0


def test_wsdl_fetched_through_proxy_points_at_proxy(target: Target) -> None:
    with LossyProxy(target.url, drop=1.0, seed=1) as proxy:  # GETs are never faulted
        client = Client(proxy.url)
        status, wsdl = client.get("/svc?wsdl")
        client.close()
    assert status == 200
    assert f'location="http://127.0.0.1:{proxy.port}/svc"'.encode() in wsdl
    assert target.base.encode() not in wsdl
    assert proxy.stats.passed_through == 1 and proxy.stats.dropped == 0


def test_path_rewrite_serves_the_prefix_at_the_root(target: Target) -> None:
    with LossyProxy(target.url, path_rewrite=True, seed=1) as proxy:
        assert proxy.url == f"http://127.0.0.1:{proxy.port}/"
        client = Client(proxy.url)
        assert client.post(b"<a/>", path="/") == (200, b"echo:<a/>")
        assert client.post(b"<b/>", path="/sub?x=1") == (200, b"echo:<b/>")
        _, wsdl = client.get("/?wsdl")
        client.close()
    with target.lock:
        paths = [path for _, path, _, _ in target.requests]
    assert paths == ["/svc", "/svc/sub?x=1", "/svc?wsdl"]
    assert f'location="http://127.0.0.1:{proxy.port}"'.encode() in wsdl


def test_chunked_request_body_is_forwarded_with_a_length(target: Target) -> None:
    with LossyProxy(target.url, seed=1) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.request("POST", "/svc", body=iter([b"<part1/>", b"<part2/>"]),
                     encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        answer = resp.status, resp.read()
        conn.close()
    assert answer == (200, b"echo:<part1/><part2/>")
    assert target.bodies() == [b"<part1/><part2/>"]


def test_bad_content_length_is_refused(target: Target) -> None:
    with LossyProxy(target.url, seed=1) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.putrequest("POST", "/svc")
        conn.putheader("Content-Length", "ten")
        conn.endheaders()
        resp = conn.getresponse()
        answer = resp.status, resp.read()
        conn.close()
    assert answer[0] == 400 and b"invalid Content-Length 'ten'" in answer[1]
    assert target.bodies() == []


@pytest.mark.parametrize("url", [
    "http://10.0.0.1:8000/svc", "http://192.168.1.1/", "http://example.com:80/svc",
    "http://[2001:db8::1]:80/", "http://0.0.0.0:8000/",
])
def test_non_loopback_target_refused(url: str) -> None:
    with pytest.raises(NotLoopbackError, match="only loopback"):
        LossyProxy(url)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "myhost"])
def test_non_loopback_listen_refused(host: str) -> None:
    with pytest.raises(NotLoopbackError):
        LossyProxy("http://127.0.0.1:1/", listen=(host, 0))


@pytest.mark.parametrize("kwargs, message", [
    ({"drop": 1.5}, "drop must be a probability"),
    ({"reorder": -0.1}, "reorder must be a probability"),
    ({"delay": (0.2, 0.1)}, "delay must be"),
    ({"drop_mode": "reset"}, "drop_mode must be one of"),
    ({"reorder_window": 0}, "reorder_window must be at least 1"),
])
def test_bad_settings_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LossyProxy("http://127.0.0.1:1/", **kwargs)


def test_https_target_refused() -> None:
    with pytest.raises(ValueError, match="http:// URL"):
        LossyProxy("https://127.0.0.1:8443/svc")


def test_loopback_variants_accepted() -> None:
    LossyProxy("http://localhost:1/svc")
    LossyProxy("http://127.0.0.2:1/svc")
    LossyProxy("http://[::1]:1/svc")


# --------------------------------------------------------------------------- #


def _sockets() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            found.add(f"{fd}:{link}")
    return found


def _settled(before: set, now, deadline: float = 20.0) -> object:
    """Wait for the TARGET's side to notice the closed connections, then return now()."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        current = now()
        if current == before:
            return current
        time.sleep(0.05)
    return now()


def test_stop_leaves_no_thread_or_socket_behind(target: Target) -> None:
    threads_before = set(threading.enumerate())
    sockets_before = _sockets()
    proxy = LossyProxy(target.url, duplicate=0.5, reorder=0.3, delay=(0.0, 0.01),
                       reorder_hold=60, seed=12).start()
    client = Client(proxy.url)
    for body in messages(20):
        client.post(body)
    # a second client idles on a kept-alive connection: stop() must cut it
    idle = Client(proxy.url)
    idle.post(b"<idle/>")
    proxy.stop()
    # the clients' own sockets are theirs to close
    client.close()
    idle.close()
    assert not any(t.name.startswith("wsrm-proxy") for t in threading.enumerate())
    assert _settled(sockets_before, _sockets) == sockets_before
    assert _settled(threads_before, lambda: set(threading.enumerate())) == threads_before


def test_stop_cuts_a_connection_held_by_drop_timeout(target: Target) -> None:
    proxy = LossyProxy(target.url, drop=1.0, drop_mode="timeout", drop_timeout=600,
                       seed=1).start()
    result: queue.Queue = queue.Queue()
    client = Client(proxy.url)
    waiter = threading.Thread(target=lambda: result.put(client.post(b"<x/>")))
    waiter.start()
    while proxy.stats.dropped == 0:
        time.sleep(0.01)
    proxy.stop()  # must not wait the 600 s
    waiter.join(30)
    assert not waiter.is_alive()
    assert result.get_nowait() is None
    client.close()


# --------------------------------------------------------------------------- #
# Command line


class _Lines:
    def __init__(self) -> None:
        self.q: queue.Queue[str] = queue.Queue()

    def write(self, text: str) -> None:
        for line in text.splitlines():
            self.q.put(line)

    def flush(self) -> None:
        pass


def test_main_in_a_thread_starts_and_stops(target: Target) -> None:
    stop = threading.Event()
    out = _Lines()
    rc: list[int] = []
    thread = threading.Thread(target=lambda: rc.append(proxy_mod.main(
        ["--target", target.url, "--port", "0", "--drop", "0.1", "--seed", "3"],
        stop=stop, out=out)))
    thread.start()
    try:
        first = out.q.get(timeout=30)
        assert first.startswith("proxying http://127.0.0.1:") and "(seed 3)" in first
        url = first.split()[1]
        client = Client(url)
        answers = [client.post(body) for body in messages(10)]
        client.close()
    finally:
        stop.set()
        thread.join(30)
    assert rc == [0]
    stats_line = out.q.get(timeout=5)
    lost = answers.count(None)
    assert f"received=10 forwarded={10 - lost} dropped={lost}" in stats_line
    assert len(target.bodies()) == 10 - lost


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_subprocess_stops_cleanly_on_signal(target: Target, sig: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "wsrm_plugin.tools.proxy", "--target", target.url, "--port", "0",
         "--drop", "0.1", "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout],
                              daemon=True)
    reader.start()
    try:
        first = lines.get(timeout=60)
        url = first.split()[1]
        client = Client(url)
        answers = [client.post(body) for body in messages(5)]
        client.close()
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert rc == 0, stderr
    stats_line = lines.get(timeout=5)
    assert stats_line.startswith("stats: received=5")
    assert len(target.bodies()) == 5 - answers.count(None)


def test_cli_refuses_non_loopback_target() -> None:
    out = _Lines()
    assert proxy_mod.main(["--target", "http://10.0.0.1:80/"], out=out) == 2


def test_cli_rejects_bad_probability() -> None:
    with pytest.raises(SystemExit):
        proxy_mod.main(["--target", "http://127.0.0.1:1/", "--drop", "2"])
