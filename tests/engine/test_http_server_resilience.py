"""The built-in server outlives what clients and its own loop do to it.

Idle connections and requests that never finish arriving are closed after their timeouts; the
connection limit stays below what the process may open; an exception out of waitress's loop is
logged and the loop starts again; a loop that keeps failing closes the listening socket (clients
are refused, not left hanging) and makes ``wait`` raise, which ends a process that serves with it
so that its supervisor starts a new one.  The flood itself (thousands of connections against a
reliable service) is ``tests/spyne_server/test_connection_flood.py``.
"""

from __future__ import annotations

import http.client
import logging
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request

import pytest

from wsrm_plugin.engine import HttpServer
from wsrm_plugin.engine.http_server import HttpServerFailed, usable_connection_limit

from .support import wait_for


def hello(environ, start_response):
    body = b"hello\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def get(port: int, timeout: float = 5.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_the_loop_is_poll_based_and_the_limit_fits_the_descriptors():
    with HttpServer(hello) as server:
        assert server._server.adj.asyncore_use_poll
        assert server.connection_limit == server._server.adj.connection_limit <= 1000
        assert get(server.port) == 200
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    try:  # a process allowed few files gets a limit it can hold, and says so
        resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 200, hard))
        limit = usable_connection_limit(1000)
        assert 0 < limit <= 200 - 64
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_idle_connection_and_a_half_sent_request_are_closed_after_their_timeouts():
    with HttpServer(hello, channel_timeout=1.0, request_timeout=1.0, request_min_rate=1024) as server:
        idle = socket.create_connection(("127.0.0.1", server.port))
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"x" * 10)
        started = time.monotonic()
        trickle_stop = threading.Event()

        def trickle() -> None:  # a byte every 0.3 s: never idle, never done
            while not trickle_stop.wait(0.3):
                try:
                    slow.sendall(b"x")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        try:
            assert closed_by_server(idle, 10)
            assert closed_by_server(slow, 10)
            assert time.monotonic() - started < 8
            assert server.slow_requests_closed == 1
            assert get(server.port) == 200
        finally:
            trickle_stop.set()
            idle.close()
            slow.close()


def test_a_large_body_on_a_link_faster_than_the_minimum_rate_is_not_cut():
    received = []

    def sink(environ, start_response):
        received.append(len(environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))))
        start_response("200 OK", [("Content-Length", "0")])
        return [b""]

    with HttpServer(sink, request_timeout=1.0, request_min_rate=64 * 1024) as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        size = 400 * 1024
        sock.sendall(f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode())
        for _ in range(25):  # 400 KiB over 2.5 s: 160 KiB/s, longer than request_timeout
            sock.sendall(b"x" * (size // 25))
            time.sleep(0.1)
        sock.settimeout(10)
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        sock.close()
    assert received == [size]


class _Failing:
    """A waitress loop fault: the listening dispatcher's readable() raises (as select() raised
    ValueError for a descriptor past 1,024), ``times`` times."""

    def __init__(self, server: HttpServer, times: int) -> None:
        self.listener = server._server
        self.original = self.listener.readable
        self.left = times
        self.listener.readable = self

    def __call__(self) -> bool:
        if self.left > 0:
            self.left -= 1
            raise ValueError("filedescriptor out of range in select()")
        return bool(self.original())


def test_a_loop_that_fails_is_logged_restarted_and_serves_again(caplog):
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    with HttpServer(hello) as server:
        keep_alive = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        keep_alive.request("GET", "/")
        assert keep_alive.getresponse().read() == b"hello\n"
        _Failing(server, times=1)
        server._server.pull_trigger()  # wake the loop: it fails at once
        assert wait_for(lambda: server.restarts == 1, timeout=10)
        assert get(server.port) == 200 and server.alive and server.failure is None
        assert server.wait(timeout=0.1) is False  # serving, not failed
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "filedescriptor out of range" in errors[0].getMessage()
    assert "dropped its 1 client connection(s)" in errors[0].getMessage()


def test_a_loop_that_keeps_failing_refuses_connections_and_wait_raises(caplog):
    heard = []
    server = HttpServer(hello, max_restarts=2, on_failure=heard.append).start()
    port = server.port
    try:
        _Failing(server, times=1000)
        server._server.pull_trigger()
        with pytest.raises(HttpServerFailed, match="filedescriptor out of range"):
            server.wait(threading.Event(), timeout=30)
        assert server.restarts == 2 and not server.alive and isinstance(heard[0], ValueError)
        with pytest.raises(ConnectionRefusedError):  # refused at once, not a zombie that accepts
            socket.create_connection(("127.0.0.1", port), timeout=5)
        assert any(r.levelno == logging.CRITICAL and "stopped serving" in r.getMessage() for r in caplog.records)
    finally:
        server.stop(5)


SERVE = textwrap.dedent("""
    import signal, sys, threading
    from wsrm_plugin.engine import HttpServer

    def hello(environ, start_response):
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]

    def fail(*_):  # the test's way to break the loop for good
        listener = server._server
        def broken():
            raise ValueError("filedescriptor out of range in select()")
        listener.readable = broken
        listener.pull_trigger()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, fail)
    server = HttpServer(hello, max_restarts=2).start()
    print("READY", server.port, flush=True)
    try:
        server.wait(stop)  # the deploy guide's pattern: raises HttpServerFailed when it gave up
    finally:
        server.stop(5)
""")


def test_a_process_serving_with_wait_exits_with_an_error_when_its_server_gives_up(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SERVE)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=root)
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split()[1])
        assert get(port) == 200
        proc.send_signal(__import__("signal").SIGUSR1)
        assert proc.wait(30) == 1  # an uncaught HttpServerFailed: the supervisor's cue
        err = proc.stderr.read()
        assert "stopped serving" in err  # the CRITICAL line (logging's last resort handler here)
        assert err.rstrip().splitlines()[-1].startswith("wsrm_plugin.engine.http_server.HttpServerFailed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_liveness_through_another_server_fails_once_a_built_in_server_gave_up():
    # the engine's RM endpoint on one built-in server, its health on another (as a service served by
    # gunicorn whose engine also serves its own endpoint): the first gives up, the second says so
    from wsrm_plugin.engine import ReliableEngine
    from wsrm_plugin.health import HealthRoutes, NodeHealth

    heard: list[BaseException] = []
    engine = ReliableEngine("memory:", name="endpoint").start()
    try:
        endpoint = engine.serve(max_restarts=0, on_failure=heard.append)
        health = NodeHealth(engine, lambda: True)
        with HttpServer(HealthRoutes(hello, health)) as probes:
            def live() -> tuple[int, str]:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{probes.port}/healthz/live", timeout=5) as r:
                        return r.status, r.read().decode()
                except urllib.error.HTTPError as error:
                    return error.code, error.read().decode()

            status, body = live()
            assert status == 200 and '"servers":{"status":"pass"' in body, body
            _Failing(endpoint, times=1000)
            endpoint._server.pull_trigger()
            assert wait_for(lambda: heard, timeout=30)
            status, body = live()
            assert status == 503 and '"servers":{"status":"fail"' in body and endpoint.url in body, body
            assert "restart the process" in body
    finally:
        engine.stop(5)


SERVE_WITHOUT_WAITING = textwrap.dedent("""
    import signal, threading
    from interceptors.spyne_server.service import reliable_service
    from tests.spyne_server import service

    def fail(*_):  # the test's way to break the loop for good
        listener = server._server
        def broken():
            raise ValueError("filedescriptor out of range in select()")
        listener.readable = broken
        listener.pull_trigger()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, fail)
    app = reliable_service(service.application(), "sqlite:///" + {store!r}).start()
    server = app.serve(max_restarts=1)
    print("READY", server.port, flush=True)
    stop.wait()  # blocks on its own event, not on server.wait(): nothing would notice the server
    app.stop(5)
""")


def test_a_service_whose_main_thread_does_not_wait_on_its_server_is_ended_for_its_supervisor(tmp_path):
    script = tmp_path / "serve.py"
    script.write_text(SERVE_WITHOUT_WAITING.format(store=str(tmp_path / "store.db")))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=root, env={**os.environ, "PYTHONPATH": root})
    try:
        line = proc.stdout.readline()
        assert line.startswith("READY"), (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split()[1])
        assert get(port) in (200, 405, 500)  # served (spyne answers a bare GET as it likes)
        proc.send_signal(__import__("signal").SIGUSR1)
        assert proc.wait(30) == 70  # EX_SOFTWARE: systemd's Restart=on-failure, any Kubernetes restart
        err = proc.stderr.read()
        assert "stopped serving and nothing waits on it" in err and f"ending process {proc.pid}" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
