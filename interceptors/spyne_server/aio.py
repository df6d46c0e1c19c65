"""A reliable service served from an asyncio application: ASGI, and aiohttp.

::

    service = reliable_service(application, store="sqlite:///rm.db")
    app = asgi_app(service)                      # uvicorn module:app, hypercorn, any ASGI server
    # or, in an aiohttp application:
    web_app = aiohttp_app(service)               # routes the service's path, starts and stops it
    web.run_app(web_app, port=8080)

What runs on the event loop is reading the request and writing the answer;
everything else runs in a :class:`~interceptors.aio_bridge.Lane` of threads
started beforehand: the interceptor chain with the WS-RM interceptor, whose
receive writes the store (an fsync, a row lock) and, for a client without a
listener, waits (bounded) for the reply to go back on the response, and
spyne for a WSDL.  The service's methods run where they always run: in the
engine's invoker threads, each inside its delivery transaction (a
``txmanager`` transaction is bound to a thread, which is why the methods
stay synchronous ``@rpc`` methods: an ``async def`` method would run its
database work outside the transaction that makes it exactly once).

Why not aiohttp-spyne (``AIOSpyne(spyne_app)``) around the service's spyne
application: it drives spyne's ``ServerBase`` directly, so the chain in
front of spyne never sees a request.  A CreateSequence is then no operation
of the service and is answered with a fault; an application message runs its
method at once, in the request, outside any store or transaction (at most
once at best, duplicated by every retransmission at worst); and without its
``threads=`` option the method even runs on the event loop.  The supported
way is this module: the reliable service's own WSGI stack (health routes,
chain, spyne) behind the loop.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from interceptors.aio_bridge import Lane
from wsrm_plugin.engine.after_response import CLOSES_BEFORE_SENDING

if TYPE_CHECKING:
    from aiohttp import web

    from interceptors.spyne_server.service import ReliableService

__all__ = ["asgi_app", "aiohttp_app", "aiohttp_handler", "WsgiInLane"]

log = logging.getLogger(__name__)

#: (status code, reason, headers, body) of one answered request.
Answer = tuple[int, str, list[tuple[str, str]], bytes]


class WsgiInLane:
    """Runs a WSGI application in a lane of ``threads`` threads, one request a call.

    ``max_body`` bounds what is read of a request before the application
    sees it (the service's own bound: four times its largest message).
    """

    def __init__(self, wsgi_app: Callable[..., Iterable[bytes]], *, threads: int = 16, max_body: int,
                 name: str = "wsrm-asgi") -> None:
        self.wsgi_app = wsgi_app
        self.max_body = max_body
        self.lane = Lane(name, threads)

    async def answer(self, environ: dict[str, Any]) -> Answer:
        answer: Answer = await self.lane.submit(self._call, environ)
        return answer

    def _call(self, environ: dict[str, Any]) -> Answer:
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return lambda data: None  # the write() callable; the stack here returns its body

        result = self.wsgi_app(environ, start_response)
        try:
            body = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = started
        code, _, reason = status.partition(" ")
        return int(code), reason, list(headers), body

    def close(self) -> None:
        self.lane.close()


def environ_for(method: str, path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes, *,
                scheme: str, server: tuple[str, int], remote: str | None, script_name: str = "") -> dict[str, Any]:
    """A WSGI environ (PEP 3333) for one request read by an asyncio server."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method, "SCRIPT_NAME": script_name, "PATH_INFO": path, "QUERY_STRING": query,
        "SERVER_NAME": server[0], "SERVER_PORT": str(server[1]), "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": remote or "", "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0), "wsgi.url_scheme": scheme, "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
        CLOSES_BEFORE_SENDING: True,  # (WsgiInLane._call closes the body, then the loop sends it)
    }
    for name, value in headers:
        key = name.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            environ["CONTENT_TYPE"] = value
        elif key != "CONTENT_LENGTH":
            key = f"HTTP_{key}"
            environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ


def _too_large(limit: int) -> Answer:
    return 413, "Content Too Large", [("Content-Type", "text/plain; charset=utf-8")], \
        f"the request exceeds {limit} bytes\n".encode()


def asgi_app(service: ReliableService, *, threads: int = 16,
             lifespan: bool = True) -> Callable[[dict[str, Any], Any, Any], Awaitable[None]]:
    """An ASGI 3 application serving ``service`` (its health routes, its WSDL, its endpoint).

    With ``lifespan`` the server's lifespan events start the service (recovery,
    workers) and stop it; without, the caller starts and stops it.
    """
    bridge = WsgiInLane(service.wsgi_app, threads=threads, max_body=4 * service.policy.max_message_size)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(service, bridge, receive, send, lifespan)
            return
        if scope["type"] != "http":
            raise RuntimeError(f"a reliable service speaks HTTP, not {scope['type']}")
        body = bytearray()
        too_large = False
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                return
            body += event.get("body", b"")
            if len(body) > bridge.max_body:
                too_large = True
                break
            if not event.get("more_body"):
                break
        if too_large:
            answer = _too_large(bridge.max_body)
        else:
            server = scope.get("server") or ("127.0.0.1", 80)
            client = scope.get("client")
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
            environ = environ_for(scope["method"], scope.get("path", "/"), scope.get("query_string", b"").decode(
                "latin-1"), headers, bytes(body), scheme=scope.get("scheme", "http"), server=(server[0], server[1]),
                remote=client[0] if client else None, script_name=scope.get("root_path", ""))
            answer = await bridge.answer(environ)
        status, _, headers_out, data = answer
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers_out]})
        await send({"type": "http.response.body", "body": data})

    return app


async def _lifespan(service: ReliableService, bridge: WsgiInLane, receive: Any, send: Any, manage: bool) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            try:
                if manage:
                    await bridge.lane.submit(service.start)
            except Exception as exc:  # noqa: BLE001 -- the server reports it and does not start
                await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
                return
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            if manage:
                await bridge.lane.submit(service.stop)
            await send({"type": "lifespan.shutdown.complete"})
            return


def aiohttp_handler(service: ReliableService, *, threads: int = 16) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp request handler serving ``service``; route any method of the service's path to it."""
    from aiohttp import web

    bridge = WsgiInLane(service.wsgi_app, threads=threads, max_body=4 * service.policy.max_message_size,
                        name="wsrm-aiohttp")

    async def handler(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > bridge.max_body:
            answer = _too_large(bridge.max_body)
        else:
            body = await request.content.read(bridge.max_body + 1)
            if len(body) > bridge.max_body:
                answer = _too_large(bridge.max_body)
            else:
                sockname = request.transport.get_extra_info("sockname") if request.transport else None
                host, port = (sockname[0], sockname[1]) if sockname else (request.host, 80)
                environ = environ_for(request.method, request.path, request.query_string, request.headers.items(),
                                      body, scheme=request.scheme, server=(host, port), remote=request.remote)
                answer = await bridge.answer(environ)
        status, reason, headers, data = answer
        response = web.Response(status=status, reason=reason or None, body=data)
        for name, value in headers:
            if name.lower() != "content-length":
                response.headers.add(name, value)
        return response

    return handler


def aiohttp_app(service: ReliableService, *, path: str = "/", threads: int = 16) -> web.Application:
    """An aiohttp application serving ``service`` at ``path``, starting it with the application and
    stopping it on cleanup; add it as a sub-application (``app.add_subapp``) or run it."""
    from aiohttp import web

    handler = aiohttp_handler(service, threads=threads)
    app = web.Application(client_max_size=4 * service.policy.max_message_size)
    base = "/" + path.strip("/")
    app.router.add_route("*", base, handler)
    app.router.add_route("*", base.rstrip("/") + "/{tail:.*}", handler)

    async def start(app: web.Application) -> None:
        await asyncio.to_thread(service.start)

    async def stop(app: web.Application) -> None:
        await asyncio.to_thread(service.stop)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
