"""The engine's sends go through the zeep client's own HTTP session: :class:`ZeepSessionTransport`.

A zeep user configures HTTP once, on the client's transport
(``zeep.Transport(session=s)`` with ``s.verify``, ``s.cert``, ``s.proxies``,
``s.auth``, ``s.headers``, and ``operation_timeout``).  Reliable calls are
not sent in the caller's thread but by the engine's workers, long after, and
retransmitted; if those posts went through another HTTP stack, every one of
those settings would be silently ignored for every reliable message (TLS
verification off, no client certificate, no proxy).  So
:func:`~interceptors.zeep_client.client.reliable_client` gives the engine this
transport: it posts with the very ``requests.Session`` zeep uses, read at
each send (a session swapped on the client later is followed).

What it adds to a bare ``session.post``: a timeout always (zeep's
``operation_timeout``, else the policy's ``http_timeout``: a worker must
never hang on a silent peer), a bound on the response size, and every
failure as the engine's :class:`~wsrm_plugin.engine.transport.TransportError`
(refused, reset, timed out, TLS verification failed), which the engine
logs and retransmits after.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

import requests

from wsrm_plugin.engine.transport import HttpTransport, Response, TransportError

__all__ = ["ZeepSessionTransport"]

log = logging.getLogger(__name__)


class ZeepSessionTransport:
    """The engine's :class:`~wsrm_plugin.engine.transport.Transport`, over a zeep client's session.

    ``client`` is the ``zeep.Client`` (its ``transport.session`` and
    ``transport.operation_timeout`` are read at each send); ``timeout`` is
    used when zeep has no operation timeout.  ``requests`` sessions pool
    connections per host and are used from the engine's sending threads at
    once, as zeep itself is when one client serves several threads.
    """

    def __init__(self, client: Any, *, timeout: float = 10.0,
                 max_response_size: int = 64 * 1024 * 1024) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        self.client = client
        self.timeout = timeout
        self.max_response_size = max_response_size
        self._lock = threading.Lock()
        self._tls_failing: set[str] = set()
        self._fast: dict[float, HttpTransport] = {}  # by timeout

    def _zeep_transport(self) -> Any:
        transport = self.client.transport
        return getattr(transport, "_inner", transport)  # engage_client wraps it

    @property
    def session(self) -> requests.Session:
        """The session the next send uses: the zeep client's, as it is now."""
        return self._zeep_transport().session

    def send(self, address: str, envelope: bytes, headers: Mapping[str, str]) -> Response:
        zeep_transport = self._zeep_transport()
        timeout = getattr(zeep_transport, "operation_timeout", None) or self.timeout
        session = zeep_transport.session
        if _nothing_to_honour(session, address):
            return self._fast_transport(timeout).send(address, envelope, headers)
        try:
            # verify passed explicitly: requests lets REQUESTS_CA_BUNDLE override a session's
            # own verify (psf/requests#3829); the session's choice is the user's.
            response = session.post(address, data=envelope, headers=dict(headers), timeout=timeout,
                                    stream=True, verify=session.verify)
        except requests.exceptions.SSLError as exc:
            # Not a lost packet: retransmitting will not fix a certificate the session refuses,
            # so say so loudly (once per peer until a send succeeds; the engine keeps retrying).
            with self._lock:
                first = address not in self._tls_failing
                self._tls_failing.add(address)
            (log.warning if first else log.debug)(
                "TLS to %s failed: %s; reliable messages to it wait in the store, retried, "
                "until the zeep session's verify/cert settings accept the peer", address, exc)
            raise TransportError(f"POST {address} failed: TLS: {exc} (the zeep session's verify/cert "
                                 "settings are used for every reliable message)") from exc
        except requests.exceptions.ProxyError as exc:
            raise TransportError(f"POST {address} failed at the zeep session's proxy: {exc}") from exc
        except requests.exceptions.RequestException as exc:
            raise TransportError(f"POST {address} failed: {exc!r}") from exc
        try:
            body = self._read(response, address)  # read to the end: the connection goes back to the pool
        except BaseException:
            response.close()
            raise
        if self._tls_failing:
            with self._lock:
                self._tls_failing.discard(address)
        return Response(response.status_code, body, dict(response.headers), url=address)

    def _read(self, response: requests.Response, address: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_content(65536):
                size += len(chunk)
                if size > self.max_response_size:
                    raise TransportError(f"the response from {address} exceeds {self.max_response_size} bytes")
                chunks.append(chunk)
        except requests.exceptions.RequestException as exc:
            raise TransportError(f"reading the response from {address} failed: {exc!r}") from exc
        return b"".join(chunks)

    def _fast_transport(self, timeout: float) -> HttpTransport:
        with self._lock:
            fast = self._fast.get(timeout)
            if fast is None:
                fast = self._fast[timeout] = HttpTransport(timeout=timeout,
                                                           max_response_size=self.max_response_size)
            return fast

    def close(self) -> None:
        """Close the fast path's connections; the session is the zeep client's, closed by its owner."""
        with self._lock:
            fast, self._fast = list(self._fast.values()), {}
        for transport in fast:
            transport.close()


_DEFAULT_HEADERS = {"user-agent", "accept-encoding", "accept", "connection"}


def _nothing_to_honour(session: Any, address: str) -> bool:
    """Whether posting with ``session`` would be a plain HTTP POST (see the module's docstring)."""
    if type(session) is not requests.Session or not address.startswith("http://"):
        return False
    if session.auth is not None or session.proxies or session.cert is not None or len(session.cookies):
        return False
    if any(session.hooks.get(name) for name in session.hooks):
        return False
    if any(key.lower() not in _DEFAULT_HEADERS for key in session.headers):
        return False
    adapter = session.get_adapter(address)  # zeep mounts file:// too; only this address's counts
    if type(adapter) is not requests.adapters.HTTPAdapter or adapter.max_retries.total != 0:
        return False
    return not (session.trust_env and _environ_proxies(address))


#: urllib reads proxies from the environment alone here; on macOS and Windows the system's
#: settings count too, and they can change without the environment changing.
_PROXIES_FROM_ENVIRONMENT_ONLY = sys.platform not in ("darwin", "win32")
#: The encoded mapping behind ``os.environ`` on POSIX (``os.environ[...] = ...`` writes it too).
_RAW_ENVIRON: dict[bytes, bytes] | None = getattr(os.environ, "_data", None) if os.name == "posix" else None
#: (a copy of the environment, requests' answer per address under it)
_environ_seen: tuple[dict[bytes, bytes], dict[str, bool]] = ({}, {})


def _environ_proxies(address: str) -> bool:
    """Would requests post to ``address`` through a proxy the environment names?

    requests' own answer (``get_environ_proxies``) decodes every environment
    variable, twice, at every send: about a tenth of the client's CPU per
    reliable message.  Like requests, it follows the environment at every send
    (a change made between two calls counts for the next one, as a user of
    requests expects, where urllib's opener and httpx's client read it once):
    the environment is compared with the copy the answers were made under, a
    comparison of two dicts of the same bytes objects made in C, and the
    answers are kept per address until it differs.
    """
    global _environ_seen
    if not _PROXIES_FROM_ENVIRONMENT_ONLY or _RAW_ENVIRON is None:
        return bool(requests.utils.get_environ_proxies(address))
    seen, answers = _environ_seen
    if _RAW_ENVIRON != seen:
        seen, answers = _environ_seen = (dict(_RAW_ENVIRON), {})
    answer = answers.get(address)
    if answer is None:
        answer = bool(requests.utils.get_environ_proxies(address))
        if len(answers) >= 256:
            answers.clear()  # the addresses posted to are few; never grow for ever
        answers[address] = answer
    return answer
