"""The proxy as an operator runs it: a target that restarts, statistics while it runs."""

from __future__ import annotations

import http.client
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from wsrm_plugin.engine.transport import HttpServer, free_port
from wsrm_plugin.tools.proxy import LossyProxy

pytestmark = pytest.mark.timeout(120)


def _echo(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body) + 5))])
    return [b"echo:" + body]


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    """One request on a connection of its own (the client side is not what is tested)."""
    parts = url.split("/", 3)
    host, port = parts[2].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/" + parts[3], body=body, headers={"Content-Type": "text/xml"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_first_requests_after_the_target_restarts_are_forwarded() -> None:
    """A restarted target closed every pooled keep-alive connection: no request may get a 502 for it."""
    port = free_port()
    server = HttpServer(_echo, port=port, threads=4).start()
    proxy = LossyProxy(f"http://127.0.0.1:{port}/svc").start()
    try:
        # Several requests at once leave several idle connections in the proxy's pool.
        barrier = threading.Barrier(4)

        def concurrent(i: int) -> tuple[int, bytes]:
            barrier.wait(10)
            return _post(proxy.url, f"before-{i}".encode())

        with ThreadPoolExecutor(4) as pool:
            before = list(pool.map(concurrent, range(4)))
        assert [status for status, _ in before] == [200] * 4
        server.stop()
        server = HttpServer(_echo, port=port, threads=4).start()
        after = [_post(proxy.url, f"after-{i}".encode()) for i in range(4)]
        assert after == [(200, f"echo:after-{i}".encode()) for i in range(4)]
        assert proxy.stats.failed == 0
    finally:
        proxy.stop()
        server.stop()


def _run_cli(args: list[str]) -> tuple[subprocess.Popen[str], queue.Queue[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "wsrm_plugin.cli", "proxy", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return proc, lines


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stderr.read()


def _next_stats(lines: queue.Queue[str]) -> str:
    while True:
        line = lines.get(timeout=30)
        if line.startswith("stats:"):
            return line


def test_wsrm_proxy_prints_statistics_periodically_while_running() -> None:
    server = HttpServer(_echo, threads=2).start()
    proc, lines = _run_cli(["--target", server.url + "svc", "--stats-interval", "0.2", "--seed", "1"])
    try:
        url = lines.get(timeout=60).split()[1]
        assert _post(url, b"one")[0] == 200
        # Printed while the proxy runs (it is not stopped before this line is read). A line may
        # fall between the count of the request and that of its forwarding: read on to both.
        while not ("received=1 " in (line := _next_stats(lines)) and "forwarded=1 " in line):
            pass
        assert proc.poll() is None
    finally:
        _stop(proc)
        server.stop()


def test_wsrm_proxy_prints_statistics_on_sigusr1() -> None:
    server = HttpServer(_echo, threads=2).start()
    proc, lines = _run_cli(["--target", server.url + "svc", "--seed", "1"])
    try:
        url = lines.get(timeout=60).split()[1]
        for body in (b"a", b"b"):
            assert _post(url, body)[0] == 200
        proc.send_signal(signal.SIGUSR1)
        line = _next_stats(lines)
        assert line.startswith("stats: received=2 forwarded=2 ") and proc.poll() is None
    finally:
        stderr = _stop(proc)
        server.stop()
    assert proc.returncode == 0, stderr
