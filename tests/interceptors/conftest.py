"""A real spyne service on 127.0.0.1 and helpers shared by the interceptor tests.

The service records what it was called with, and what the chain told it
(the wsa:MessageID it saw through :func:`current_message`), so a test can see
both sides of the wire.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11, Soap12

from interceptors.spyne_server.adapter import current_message

TNS = "urn:test:interceptors"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


@contextmanager
def serve(app: Callable) -> Iterator[str]:
    """Serve a WSGI app on a free loopback port; yields its base URL."""
    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer,
                         handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class Wire:
    """What crossed the wire: each request body and each (status, body) answer."""

    requests: list[bytes] = field(default_factory=list)
    responses: list[tuple[str, bytes]] = field(default_factory=list)

    def wrap(self, app: Callable) -> Callable:
        def recorder(environ: dict, start_response: Callable):
            if environ["REQUEST_METHOD"] == "POST":
                import io
                body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                self.requests.append(body)
                environ["wsgi.input"] = io.BytesIO(body)
            seen: dict[str, str] = {}

            def spy(status: str, headers: list, exc_info: Any = None):
                seen["status"] = status
                return start_response(status, headers, exc_info)

            chunks = b"".join(app(environ, spy))
            if environ["REQUEST_METHOD"] == "POST":
                self.responses.append((seen["status"], chunks))
            return [chunks]
        return recorder


@dataclass
class Service:
    """A spyne Application plus the calls its methods received."""

    application: Application
    calls: list[tuple[str, str]]


def make_service(soap12: bool = False) -> Service:
    calls: list[tuple[str, str]] = []

    class Echo(ServiceBase):
        @rpc(Unicode, _returns=Unicode)
        def echo(ctx, text):
            calls.append(("echo", text))
            return text

        @rpc(_returns=Unicode)
        def whoami(ctx):
            """The wsa:MessageID the chain read from this request."""
            message = current_message(ctx)
            calls.append(("whoami", ""))
            return message.addressing.message_id if message and message.addressing else "none"

        @rpc(Unicode, _is_async=True)
        def notify(ctx, text):
            calls.append(("notify", text))

    protocol = Soap12 if soap12 else Soap11
    application = Application([Echo], tns=TNS, name="EchoApp",
                              in_protocol=protocol(validator="lxml"), out_protocol=protocol())
    return Service(application, calls)


@pytest.fixture
def service() -> Service:
    return make_service()
