"""The spyne service behind the anonymous-client tests, what it ran, and a reply callback."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11

TNS = "urn:wsrm-anonymous-test"

_lock = threading.Lock()
RAN: collections.Counter = collections.Counter()        # text -> times a method ran (committed or not)
REPLIES: collections.Counter = collections.Counter()    # (result, context) -> times the callback ran
_config: dict[str, Any] = {"delay": 0.0}


def reset(delay: float = 0.0) -> None:
    with _lock:
        RAN.clear()
        REPLIES.clear()
    _config["delay"] = delay


class EchoService(ServiceBase):
    @rpc(Unicode, _returns=Unicode)
    def echo(ctx, text):  # noqa: N805 -- spyne's signature
        with _lock:
            RAN[text] += 1
        if _config["delay"]:
            time.sleep(_config["delay"])  # slower than the server waits: the reply comes on a retry
        return "re:" + text

    @rpc(Unicode, _is_async=True)
    def note(ctx, text):  # noqa: N805
        with _lock:
            RAN[text] += 1


def application() -> Application:
    return Application([EchoService], tns=TNS, name="EchoService",
                       in_protocol=Soap11(validator="lxml"), out_protocol=Soap11())


def on_reply(reply: Any) -> None:
    """Reply callback by import path: counts every reply the client's invoker hands over."""
    with _lock:
        REPLIES[(reply.result, reply.user_context)] += 1
