"""The spyne service the conformance tests talk to: an answering, a one-way and a header-taking operation."""

from __future__ import annotations

import collections
import threading

from spyne import Application, ComplexModel, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11, Soap12

TNS = "urn:wsrm-conformance"

_lock = threading.Lock()
#: text -> times a method ran
RAN: collections.Counter = collections.Counter()


def reset() -> None:
    with _lock:
        RAN.clear()


class Tag(ComplexModel):
    """A header the ``tagged`` operation declares: a mustUnderstand Tag is understood."""

    __namespace__ = TNS
    value = Unicode


class ConformanceService(ServiceBase):
    @rpc(Unicode, _returns=Unicode)
    def echo(ctx, text):  # noqa: N805 -- spyne's signature
        with _lock:
            RAN[text] += 1
        return "re:" + text

    @rpc(Unicode, _is_async=True)
    def note(ctx, text):  # noqa: N805
        with _lock:
            RAN[text] += 1

    @rpc(Unicode, _in_header=(Tag,), _is_async=True)
    def tagged(ctx, text):  # noqa: N805
        with _lock:
            RAN[f"{text}/{ctx.in_header.value if ctx.in_header else None}"] += 1


def application(soap: str = "1.2") -> Application:
    protocol = Soap12 if soap == "1.2" else Soap11
    return Application([ConformanceService], tns=TNS, name="ConformanceService",
                       in_protocol=protocol(validator="lxml"), out_protocol=protocol())


def ran(text: str) -> int:
    with _lock:
        return RAN[text]
