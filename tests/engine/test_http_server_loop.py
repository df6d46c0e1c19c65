"""HttpServer's loop thread does not spin while a task thread holds a connection's out buffer.

waitress's own channel makes the loop ask "writable?" again at once while a task
holds the buffer with bytes in it; on the reliable service that was ~7 wasted
rounds per message, each taking the GIL back from the task.  Here a task holds
the buffer on purpose, with its bytes in it and the socket free to take them,
and the loop thread's CPU time over that hold is read from the kernel (waitress's
own channel spends all of it).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from wsrm_plugin.engine import HttpServer

BODY = 64 * 1024
HOLD = 0.6


def _thread_cpu(thread: threading.Thread) -> float:
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


class _HoldingApp:
    """Answers BODY; the task's first send to the socket waits HOLD seconds first.

    That is the moment the loop spins on with waitress's own channel: the task
    thread is inside write_soon, holding the out buffer with the bytes in it (in
    real life it waits there for the GIL, after the send), and the socket is
    writable.  The loop is woken meanwhile (the trigger), as another connection's
    request would wake it.
    """

    def __init__(self) -> None:
        self.loop_thread: threading.Thread | None = None
        self.loop_cpu: float | None = None
        self.held = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        channel = environ["waitress.client_disconnected"].__self__  # waitress's bound method
        real_send = channel.send

        def send_after_a_hold(data: bytes, *args: Any, **kwargs: Any) -> int:
            del channel.send  # once
            assert channel.total_outbufs_len > 0 and self.loop_thread is not None
            before = _thread_cpu(self.loop_thread)
            channel.server.pull_trigger()
            time.sleep(HOLD)
            self.loop_cpu = _thread_cpu(self.loop_thread) - before
            self.held.set()
            return int(real_send(data, *args, **kwargs))

        channel.send = send_after_a_hold
        start_response("200 OK", [("Content-Type", "application/octet-stream"),
                                  ("Content-Length", str(BODY))])
        return [b"x" * BODY]


def _get(port: int, path: str = "/", *, close: bool = False) -> socket.socket:
    """A connection that has sent ``GET path`` (asking the server to close after it: ``close``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    closing = "Connection: close\r\n" if close else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{closing}\r\n".encode())
    return sock


def _fetch(port: int, path: str = "/") -> bytes:
    """The whole answer to ``GET path`` on a connection of its own, read until the server closes it."""
    with _get(port, path, close=True) as sock:
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def _read_response(sock: socket.socket) -> tuple[bytes, int]:
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    received = len(body)
    while received < BODY:
        chunk = sock.recv(1 << 20)
        assert chunk, f"the connection closed after {received} of {BODY} bytes"
        received += len(chunk)
    return head, received


def test_the_loop_waits_quietly_while_a_task_holds_the_buffer_and_then_sends_the_rest() -> None:
    app = _HoldingApp()
    with HttpServer(app, threads=2) as server:
        app.loop_thread = server._thread
        sock = _get(server.port)
        try:
            assert app.held.wait(30), "the task never finished its hold"
            head, received = _read_response(sock)
        finally:
            sock.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert received == BODY
    assert app.loop_cpu is not None
    # waitress's stock channel spends the whole hold spinning (about HOLD seconds of CPU)
    assert app.loop_cpu < HOLD / 4, f"the loop thread used {app.loop_cpu:.3f} s of CPU in {HOLD} s"


def test_other_connections_are_served_while_one_task_holds_its_buffer() -> None:
    app = _HoldingApp()

    def router(environ: dict[str, Any], start_response: Any) -> Any:
        if environ["PATH_INFO"] == "/hold":
            return app(environ, start_response)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    with HttpServer(router, threads=2) as server:
        app.loop_thread = server._thread
        holder = _get(server.port, "/hold")
        try:
            answers = [_fetch(server.port, "/ping") for _ in range(3)]  # while the other task holds its buffer
            assert app.held.wait(30)
            _, received = _read_response(holder)
        finally:
            holder.close()
    assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"ok") for a in answers)
    assert received == BODY


def test_the_loop_waits_quietly_while_a_task_has_written_less_than_send_bytes() -> None:
    """waitress 2's default: a task's first bytes wait in the buffer until it has written
    ``send_bytes`` (18000) or ends; meanwhile the loop cannot send them, and must not spin."""
    loop_cpu: list[float] = []
    loop_thread: list[threading.Thread] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        channel = environ["waitress.client_disconnected"].__self__
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "8")])

        def body() -> Any:
            yield b"half"  # stays in the buffer: below send_bytes, while the task runs on
            assert channel.total_outbufs_len > 0
            before = _thread_cpu(loop_thread[0])
            channel.server.pull_trigger()  # as another connection's request would wake the loop
            time.sleep(HOLD)
            loop_cpu.append(_thread_cpu(loop_thread[0]) - before)
            yield b"done"

        return body()

    with HttpServer(app, threads=2) as server:
        server._server.adj.send_bytes = 18000
        loop_thread.append(server._thread)
        answer = _fetch(server.port)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"halfdone")
    assert loop_cpu and loop_cpu[0] < HOLD / 4, f"the loop thread used {loop_cpu} s of CPU in {HOLD} s"
