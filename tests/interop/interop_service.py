"""The project's side of the gSOAP interop tests: a spyne service shaped like ``gsoap/echo.h``.

gSOAP dispatches on ``wsa:Action`` and writes document/literal bodies with
qualified elements in :data:`~tests.interop.gsoap_peer.NAMESPACE`, so the spyne
service must produce and accept exactly that shape: ``<ns:Note><ns:text>``
(one-way) and ``<ns:Echo><ns:text>`` answered by ``<ns:EchoResponse><ns:text>``.
Every run of a method is recorded (per process) so a test can tell "delivered
exactly once" from "delivered at least once".
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from spyne import Application, ServiceBase, Unicode, rpc
from spyne.protocol.soap import Soap11, Soap12

from interceptors.spyne_server.service import delivery_context
from tests.interop.gsoap_peer import NAMESPACE

__all__ = ["EchoService", "application", "reset", "runs", "Run"]

_lock = threading.Lock()


class Run(NamedTuple):
    """One run of a service method, with the WS-RM delivery it ran for."""

    operation: str
    text: str
    sequence: str | None  # None: not run by the invoker (an unreliable call)
    number: int | None


_RUNS: list[Run] = []


def reset() -> None:
    with _lock:
        _RUNS.clear()


def runs() -> list[Run]:
    """Every method run so far, in the order they ran."""
    with _lock:
        return list(_RUNS)


def _record(ctx, operation: str, text: str) -> None:
    delivery = delivery_context(ctx)
    with _lock:
        _RUNS.append(Run(operation, text, delivery.sequence_id if delivery else None,
                         delivery.message_number if delivery else None))


class EchoService(ServiceBase):
    """``echo.h`` in spyne: the method names are the element names gSOAP sends."""

    @rpc(Unicode, _is_async=True)
    def Note(ctx, text):  # noqa: N802,N805 -- the wire names
        _record(ctx, "Note", text)

    @rpc(Unicode, _returns=Unicode, _out_variable_name="text")
    def Echo(ctx, text):  # noqa: N802,N805
        _record(ctx, "Echo", text)
        return text


def application(soap_version: str = "1.2") -> Application:
    """A new Application (engaging one adds listeners to it) speaking SOAP ``soap_version``."""
    protocol = {"1.1": Soap11, "1.2": Soap12}[soap_version]
    return Application([EchoService], tns=NAMESPACE, name="Echo",
                       in_protocol=protocol(validator="lxml"), out_protocol=protocol())
