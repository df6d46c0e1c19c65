"""A real spyne service behind a ReliableEngine, and reply callbacks the client imports by path.

The server engine receives WS-RM traffic; its invoker hands each message to
spyne through a synthetic WSGI request (the way a reliable spyne server
re-drives a stored message) and sends spyne's answer back with
``context.reply`` on the sequence the client offered.
"""

from __future__ import annotations

import collections
import io
import threading
from typing import Any
from wsgiref.util import setup_testing_defaults

from spyne import Application, Integer, ServiceBase, Unicode, rpc
from spyne.model.fault import Fault
from spyne.protocol.soap import Soap11
from spyne.server.wsgi import WsgiApplication

from interceptors import InterceptorChain
from interceptors.spyne_server.adapter import engage
from wsrm_plugin.wire import EndpointReference

TNS = "urn:wsrm-zeep-client-test"

#: What the service ran, by text, in the order it ran (one server per test at a time).
RECEIVED: list[str] = []
ECHOED: list[str] = []
RESERVED: list[tuple[int, int, int]] = []
_lock = threading.Lock()
#: Called by ``echo`` with its text before it answers (a test's work in the delivery's transaction).
ON_ECHO: list[Any] = []
#: Called by ``record`` with its text (a test's work in the delivery's transaction).
ON_RECORD: list[Any] = []


def reset() -> None:
    with _lock:
        RECEIVED.clear()
        ECHOED.clear()
        RESERVED.clear()
        ON_ECHO.clear()
        ON_RECORD.clear()


class OrderService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def record(ctx, text):  # noqa: N805 -- spyne's signature
        with _lock:
            RECEIVED.append(text)
        for work in ON_RECORD:
            work(text)

    @rpc(Unicode, _returns=Unicode)
    def echo(ctx, text):  # noqa: N805
        if text == "boom":
            raise Fault("Client", "the service refuses 'boom'")
        with _lock:
            ECHOED.append(text)
        for work in ON_ECHO:
            work(text)
        return "re:" + text


    @rpc(Integer, Integer, Integer, _is_async=True)
    def reserve(ctx, item, quantity, customer):  # noqa: N805
        with _lock:
            RESERVED.append((item, quantity, customer))

    @rpc(Unicode, _returns=Integer)
    def stock(ctx, item):  # noqa: N805
        return 7 if item == "apples" else 0


def spyne_app() -> Application:
    return Application([OrderService], tns=TNS, in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


class SpyneReceiver:
    """The server engine's application (delivery) and its WSGI front (``?wsdl`` to spyne)."""

    def __init__(self) -> None:
        self.wsgi = WsgiApplication(spyne_app())
        self.front = engage(self.wsgi.app, InterceptorChain([], load_entry_points=False),
                            rm_policy=False, wsgi_application=self.wsgi)

    def middleware(self, endpoint: Any) -> Any:
        def app(environ: dict[str, Any], start_response: Any) -> Any:
            if environ.get("REQUEST_METHOD") == "GET":
                return self.front(environ, start_response)
            return endpoint(environ, start_response)
        return app

    def __call__(self, envelope: bytes, context: Any) -> None:
        environ: dict[str, Any] = {}
        setup_testing_defaults(environ)
        environ.update({"REQUEST_METHOD": "POST", "wsgi.input": io.BytesIO(envelope),
                        "CONTENT_LENGTH": str(len(envelope)), "CONTENT_TYPE": "text/xml; charset=utf-8",
                        "HTTP_SOAPACTION": f'"{context.action}"'})
        status: list[str] = []
        body = b"".join(self.wsgi(environ, lambda s, h, exc_info=None: status.append(s)))
        if not body or not context.reply_to or EndpointReference(context.reply_to).is_anonymous:
            return
        if status[0].startswith("500"):
            context.reply(body, action="http://www.w3.org/2005/08/addressing/soap/fault")
        else:
            context.reply(body, action=f"{context.action}Response")


def plain_front() -> Any:
    """The OrderService as a plain SOAP service: no WS-RM in front of it (CreateSequence is a Sender fault)."""
    wsgi = WsgiApplication(spyne_app())
    return engage(wsgi.app, InterceptorChain([], load_entry_points=False), rm_policy=False,
                  wsgi_application=wsgi)


# -- reply callbacks, imported by path by the client's invoker ------------------------------------

REPLIES: collections.Counter = collections.Counter()
REPLY_LOG: list[Any] = []


def on_reply(reply: Any) -> None:
    with _lock:
        key = reply.result if reply.fault is None else f"fault:{reply.fault}"
        REPLIES[(key, reply.user_context)] += 1
        REPLY_LOG.append(reply)


def append_reply(reply: Any) -> None:
    """A callback for the crash test: one line per reply in the file named by $WSRM_REPLY_FILE."""
    import os

    line = f"{reply.result if reply.fault is None else 'fault'} {reply.user_context}\n"
    with open(os.environ["WSRM_REPLY_FILE"], "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def append_reply_idempotent(reply: Any) -> None:
    """A callback written as ReliableReply's docstring says: on a redelivery, it checks by
    ``request_message_id`` whether it already did its work.  With $WSRM_HANG_IN_CALLBACK it creates
    that file after its first write and hangs there, before the delivery commits (the test kills it)."""
    import os
    import time

    path = os.environ["WSRM_REPLY_FILE"]
    if getattr(reply, "redelivered", False):
        with open(path + ".redelivered", "a", encoding="utf-8") as f:
            f.write(f"{reply.request_message_id}\n")
        done = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                done = f.read().splitlines()
        if any(line.split(" ", 1)[0] == reply.request_message_id for line in done):
            return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{reply.request_message_id} {reply.result} {reply.user_context}\n")
        f.flush()
        os.fsync(f.fileno())
    hang = os.environ.get("WSRM_HANG_IN_CALLBACK")
    if hang:
        with open(hang, "w"):
            pass
        time.sleep(3600)
