"""The engine's sends for a ``zeep.AsyncClient``: through the synchronous twin of its HTTP client.

An asyncio application configures HTTP on zeep's ``AsyncTransport``, which
holds two httpx clients made with the same settings (``verify_ssl``,
``proxy``, timeouts): ``client``, an ``httpx.AsyncClient`` tied to the
application's event loop, and ``wsdl_client``, a synchronous
``httpx.Client`` zeep loads the WSDL with.  The engine sends and
retransmits from its own threads, long after the call, where the
``AsyncClient`` cannot be used (its connection pool belongs to the loop that
first used it), so reliable messages go out through ``wsdl_client``: give
it the settings reliable messages need (``AsyncTransport(client=...,
wsdl_client=httpx.Client(verify=..., cert=..., auth=...))``), as zeep
itself needs them to reach the service.

:class:`HttpxTransport` is that engine transport; :class:`SyncTwinTransport`
is the zeep transport of the synchronous twin the reliable client builds its
calls with (zeep serializes them there, in the client's own thread).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import requests
from requests.structures import CaseInsensitiveDict

from wsrm_plugin.engine.transport import HttpTransport, Response, TransportError

__all__ = ["HttpxTransport", "SyncTwinTransport"]

log = logging.getLogger(__name__)

_DEFAULT_HEADERS = {"user-agent", "accept-encoding", "accept", "connection"}


class HttpxTransport:
    """The engine's :class:`~wsrm_plugin.engine.transport.Transport` over a synchronous ``httpx.Client``.

    ``client`` is read at each send through ``source()`` (zeep's
    ``AsyncTransport.wsdl_client``, as it is now).  A plain client posting
    to an ``http://`` address (no auth, cookies, hooks, proxies or headers
    of its own) goes through the engine's own HTTP/1.1 transport instead:
    the same request at a fraction of httpx's CPU per message.
    """

    def __init__(self, source: Any, *, timeout: float = 10.0, max_response_size: int = 64 * 1024 * 1024) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        self._source = source
        self.timeout = timeout
        self.max_response_size = max_response_size
        self._lock = threading.Lock()
        self._fast: HttpTransport | None = None

    @property
    def client(self) -> Any:
        """The ``httpx.Client`` the next send uses."""
        return self._source()

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response:
        import httpx

        client = self._source()
        if _nothing_to_honour(client, address):
            return self._fast_transport().send(address, envelope, headers)
        try:
            with client.stream("POST", address, content=envelope, headers=dict(headers),
                               timeout=self.timeout) as response:
                chunks: list[bytes] = []
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_response_size:
                        raise TransportError(f"the response from {address} exceeds {self.max_response_size} bytes")
                    chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise TransportError(f"POST {address} failed: {exc!r} (the AsyncTransport's wsdl_client "
                                 "settings are used for every reliable message)") from exc
        return Response(response.status_code, b"".join(chunks), dict(response.headers), url=address)

    def _fast_transport(self) -> HttpTransport:
        with self._lock:
            if self._fast is None:
                self._fast = HttpTransport(timeout=self.timeout, max_response_size=self.max_response_size)
            return self._fast

    def close(self) -> None:
        """Close the fast path's connections; the httpx client is zeep's, closed by its owner."""
        with self._lock:
            fast, self._fast = self._fast, None
        if fast is not None:
            fast.close()


def _nothing_to_honour(client: Any, address: str) -> bool:
    """Would posting with ``client`` be a plain HTTP POST (see :class:`HttpxTransport`)?"""
    import httpx

    if type(client) is not httpx.Client or not address.startswith("http://"):
        return False
    if client.auth is not None or len(client.cookies) or any(client.event_hooks.values()):
        return False
    if any(key.lower() not in _DEFAULT_HEADERS for key in client.headers):
        return False
    if getattr(client, "_mounts", None):  # proxies (httpx mounts a transport per proxied pattern)
        return False
    return type(getattr(client, "_transport", None)) is httpx.HTTPTransport


class SyncTwinTransport:
    """The zeep transport of an ``AsyncClient``'s synchronous twin: loads as zeep does, posts with
    ``wsdl_client``.  A reliable client's chain consumes every request, so ``post_xml`` only
    runs for calls made on the twin outside the chain."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner  # zeep.transports.AsyncTransport

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # load, cache, settings, logger...

    def post_xml(self, address: str, envelope: Any, headers: Mapping[str, str]) -> requests.Response:
        from zeep.wsdl.utils import etree_to_string

        response = self._inner.wsdl_client.post(address, content=etree_to_string(envelope), headers=dict(headers))
        result = requests.Response()
        result._content = response.read()
        result.status_code = response.status_code
        result.headers = CaseInsensitiveDict(response.headers)
        result.encoding = response.encoding
        return result
