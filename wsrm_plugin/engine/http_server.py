"""The built-in HTTP server: waitress in a background thread, made to outlive a flood of connections.

A reliable service is only as available as the socket it listens on.  waitress
as configured before served 1,000 connections with a select() loop: 1,100
idle connections pushed its descriptors past select()'s 1,024, the loop
thread died of ``ValueError: filedescriptor out of range in select()``, and
the listening socket stayed open with nobody behind it (connections accepted
by the kernel, never answered: a zombie).  :class:`HttpServer` now:

* runs waitress's poll() loop (no descriptor ceiling);
* accepts at most ``connection_limit`` connections, lowered at start to what
  the process's ``RLIMIT_NOFILE`` leaves after the descriptors already open
  and a reserve for the rest of the process (stores, outgoing connections);
  beyond it waitress stops accepting and connections wait in the kernel's
  backlog, so a flood costs service only while it lasts;
* closes a connection idle for ``channel_timeout`` seconds, and one whose
  request has not fully arrived ``request_timeout`` seconds after its first
  byte (plus one second per ``request_min_rate`` bytes received, so a large
  body on a slow link is not cut): a client that sends a byte now and then
  cannot hold a slot for ever (Apache's mod_reqtimeout, nginx's
  ``client_header_timeout``);
* supervises its loop thread: an exception out of the loop is logged (ERROR,
  with its traceback), the client connections are dropped (the cause is most
  likely one of them; their clients reconnect, WS-RM sends again) and the
  loop starts again.  When it fails ``max_restarts`` times within a minute the
  server gives up: it closes its listening socket (clients are refused at once
  instead of hanging), logs CRITICAL, records :attr:`HttpServer.failure`, calls
  ``on_failure`` and makes :meth:`HttpServer.wait` raise
  :class:`HttpServerFailed`: a process that serves with ``server.wait(stop)``
  exits, and its supervisor (systemd, Kubernetes) starts a fresh one.  A
  process that does not wait on the server (its main thread blocks on
  something else) would live on without serving, a zombie to its supervisor:
  so when nobody waits and no ``on_failure`` hook took the failure over, the
  server ends the process itself, with :data:`EXIT_STATUS` (``exit_on_failure``
  says otherwise: True always, False never).  The health checks' liveness
  fails meanwhile (:mod:`wsrm_plugin.health`, its ``servers`` check).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["EXIT_STATUS", "HttpServer", "HttpServerFailed", "usable_connection_limit"]

log = logging.getLogger(__name__)

#: Failures of the loop within this many seconds that make the server give up.
_RESTART_WINDOW = 60.0
#: The status a process ends with when its server gave up and nothing else would end it
#: (``EX_SOFTWARE`` of sysexits.h: an internal error; systemd's ``Restart=on-failure`` restarts it).
EXIT_STATUS = 70
#: Seconds a server that gave up leaves for a thread to come and wait on it before it ends the
#: process (a server that fails right at start, before the main thread reached ``wait``).
_WAITER_GRACE = 1.0


class HttpServerFailed(RuntimeError):
    """The server's loop kept failing and the server stopped serving (its listening socket is
    closed).  Restart the process: see the deploy guide's "When the server itself fails"."""


def usable_connection_limit(requested: int) -> int:
    """``requested``, or less: what RLIMIT_NOFILE leaves for client connections.

    The descriptors already open and a reserve for the rest of the process
    (an eighth of the limit, at least 64: stores, log files, outgoing
    connections, waitress's own trigger) are taken off the soft limit.  At the
    limit, accept() fails with EMFILE and waitress's loop retries it at once,
    for as long as the flood lasts: better never to get there.
    """
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # not POSIX
        return requested
    if soft == resource.RLIM_INFINITY:
        return requested
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64  # not Linux: a guess, on the safe side
    return max(1, min(requested, soft - in_use - max(64, soft // 8)))


@functools.cache
def _quiet_channel_class() -> type:
    """waitress's HTTP channel without its busy wait while a request's thread is writing, and
    with the time its current request began (for ``request_timeout``).

    waitress's loop thread asks every channel ``writable()`` before each
    ``select`` and, when one says yes, calls its ``handle_write``.  While a
    request's task is running, that only flushes the out buffer when the task
    is not holding it and it holds at least ``send_bytes``; a channel with
    bytes in its buffer says yes all the same, so while its task holds the
    buffer (inside ``write_soon``) or has written less than ``send_bytes``
    (waitress 2's default of 18000), the loop does nothing with it and asks
    again at once.  Under concurrent requests that loop spins: measured on the
    reliable service with waitress 3, ~7 such rounds per message, each taking
    the GIL back from the very thread it waits for (5-7% of the service's rate,
    ``bench/bench_compare.py``).  This channel says yes only when
    ``handle_write`` would act; a task that leaves ``send_bytes`` or more in
    the buffer wakes the loop (the trigger) once it lets go of it, so those
    bytes never wait for the loop's one-second timeout.
    """
    from waitress.channel import HTTPChannel

    class QuietChannel(HTTPChannel):
        #: The request being received (waitress's parser), when it began, and its bytes so far.
        _timed: Any = None
        request_began = 0.0
        request_bytes = 0

        def writable(self) -> bool:
            if self.requests and not (self.will_close or self.close_when_flushed):
                if self.total_outbufs_len < self.adj.send_bytes:
                    return False  # too little to send while the task runs (handle_write waits too)
                if not self.outbuf_lock.acquire(False):
                    return False  # the task holds it: its write_soon pulls the trigger after
                self.outbuf_lock.release()
            return bool(super().writable())

        def write_soon(self, data: bytes) -> int:
            written = int(super().write_soon(data))
            if self.total_outbufs_len >= self.adj.send_bytes and self.connected:
                self.server.pull_trigger()  # left for the loop, now that the buffer is free
            return written

        def received(self, data: bytes) -> bool:
            began = self.request is None
            result = bool(super().received(data))
            if self.request is None:
                self._timed = None
            elif began or self.request is not self._timed:
                self._timed, self.request_began, self.request_bytes = self.request, time.monotonic(), len(data)
            else:
                self.request_bytes += len(data)
            return result

        def request_overdue(self, now: float, timeout: float, min_rate: float) -> bool:
            """A request that began arriving too long ago for the bytes it has sent."""
            return (self._timed is not None and self.request is self._timed
                    and now - self.request_began > timeout + self.request_bytes / min_rate)

    return QuietChannel


class HttpServer:
    """A WSGI application served by waitress in a background thread (HTTP/1.1 keep-alive).

    ``port=0`` picks a free port; :attr:`url` is the base address once
    started.  ``max_body`` is waitress's own hard limit (the endpoint's
    SOAP-level limit should be below it, so clients get a SOAP fault).  The
    other keywords bound what clients may hold (see the module's docstring):
    ``connection_limit`` connections at once (lowered to what RLIMIT_NOFILE
    allows), idle ones closed after ``channel_timeout`` seconds, a request not
    fully received ``request_timeout`` seconds (plus a second per
    ``request_min_rate`` bytes) after its first byte closed too.
    ``on_failure(error)`` hears when the loop failed for good; ``exit_on_failure``
    says whether the server then ends the process (:data:`EXIT_STATUS`): None
    (the default) when neither a thread waits in :meth:`wait` nor ``on_failure``
    is given, True always (after ``on_failure``), False never.
    """

    def __init__(self, app: Callable[..., Any], host: str = "127.0.0.1", port: int = 0, *,
                 threads: int = 4, max_body: int = 64 * 1024 * 1024, path: str = "/",
                 connection_limit: int = 1000, channel_timeout: float = 60.0, request_timeout: float = 30.0,
                 request_min_rate: float = 64 * 1024, max_restarts: int = 5,
                 on_failure: Callable[[BaseException], None] | None = None,
                 exit_on_failure: bool | None = None) -> None:
        for name, value in (("connection_limit", connection_limit), ("channel_timeout", channel_timeout),
                            ("request_timeout", request_timeout), ("request_min_rate", request_min_rate)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0, not {value!r}")
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, not {max_restarts!r}")
        if exit_on_failure not in (None, True, False):
            raise ValueError(f"exit_on_failure must be True, False or None (automatic), not {exit_on_failure!r}")
        self.app = app
        self.host = host
        self.requested_port = port
        self.threads = threads
        self.max_body = max_body
        self.path = path if path.startswith("/") else "/" + path
        self.requested_connection_limit = connection_limit
        self.channel_timeout = channel_timeout
        self.request_timeout = request_timeout
        self.request_min_rate = request_min_rate
        self.max_restarts = max_restarts
        self.on_failure = on_failure
        self.exit_on_failure = exit_on_failure
        #: The connection limit in force (``connection_limit``, or less: see :func:`usable_connection_limit`).
        self.connection_limit = connection_limit
        #: Times the loop failed and was started again; the error that made the server give up.
        self.restarts = 0
        self.failure: BaseException | None = None
        #: Connections closed for a request that arrived too slowly (``request_timeout``).
        self.slow_requests_closed = 0
        self._server: Any = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ended = threading.Event()
        self._failures: deque[float] = deque()
        #: Threads inside wait(): they raise HttpServerFailed, so the server need not end the process.
        self._waiters = 0
        self._waiters_lock = threading.Lock()

    def start(self) -> HttpServer:
        import waitress

        if self._server is not None:
            raise RuntimeError("server already started")
        self.connection_limit = usable_connection_limit(self.requested_connection_limit)
        if self.connection_limit < self.requested_connection_limit:
            log.warning("serving at most %d connections, not %d: the process may open %s files (ulimit -n); "
                        "raise it to allow more", self.connection_limit, self.requested_connection_limit,
                        _soft_nofile())
        self._server = waitress.create_server(
            self.app, host=self.host, port=self.requested_port, threads=self.threads,
            max_request_body_size=self.max_body, channel_timeout=max(1, round(self.channel_timeout)),
            connection_limit=self.connection_limit, cleanup_interval=1, asyncore_use_poll=True,
            clear_untrusted_proxy_headers=True, ident="wsrm")
        self._server.channel_class = _quiet_channel_class()
        self._server.maintenance = functools.partial(self._maintenance, self._server, self._server.maintenance)
        self._server.handle_error = functools.partial(self._listener_error, self._server)
        self._port = int(self._server.effective_port)
        self._stopping = False
        self._ended.clear()
        self._thread = threading.Thread(target=self._run, name=f"wsrm-http-{self.port}", daemon=True)
        self._thread.start()
        log.info("serving on %s", self.url)
        return self

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}{self.path}"

    @property
    def alive(self) -> bool:
        """Serving: started, not stopped, its loop thread running."""
        return self._server is not None and self._thread is not None and self._thread.is_alive()

    # -- the loop and its supervision -------------------------------------------------------------

    def _run(self) -> None:
        server = self._server
        try:
            while True:
                try:
                    server.run()  # waitress's loop: returns once every socket is closed (stop)
                    if not self._stopping:  # its sockets closed under it: nothing left to serve with
                        self._give_up(server, RuntimeError("the loop ended with its sockets closed"))
                    return
                except Exception as exc:  # noqa: BLE001 -- whatever ends the loop is reported, then handled
                    if self._stopping or not self._may_restart(exc):
                        return
        except BaseException as exc:  # MemoryError and the like: nothing left to restart with
            self._give_up(server, exc)
            raise
        finally:
            self._ended.set()

    def _may_restart(self, exc: Exception) -> bool:
        """Log the loop's failure; drop the client connections and go on, or give up."""
        now = time.monotonic()
        self._failures.append(now)
        while self._failures and now - self._failures[0] > _RESTART_WINDOW:
            self._failures.popleft()
        if len(self._failures) > self.max_restarts:
            self._give_up(self._server, exc)
            return False
        dropped = self._drop_connections(self._server)
        self.restarts += 1
        log.error("the HTTP server on %s failed (%s: %s); dropped its %d client connection(s) and serving again "
                  "(restart %d; more than %d within %.0fs and it stops)", self.url, type(exc).__name__, exc,
                  dropped, self.restarts, self.max_restarts, _RESTART_WINDOW, exc_info=exc)
        time.sleep(min(0.05 * len(self._failures), 1.0))  # a fault that repeats at once does not spin
        return True

    @staticmethod
    def _drop_connections(server: Any) -> int:
        """Close every client connection (not the listening socket, not the loop's trigger)."""
        keep = {id(server), id(server.trigger)}
        dropped = 0
        for fd, dispatcher in list(server._map.items()):
            if id(dispatcher) in keep:
                continue
            try:
                dispatcher.close()
            except Exception:  # noqa: BLE001 -- a broken one must not stop the others' closing
                log.debug("closing connection %s failed", fd, exc_info=True)
            server._map.pop(fd, None)
            server.active_channels.pop(fd, None)
            dropped += 1
        return dropped

    def _give_up(self, server: Any, exc: BaseException) -> None:
        from waitress import wasyncore

        self.failure = exc
        try:
            wasyncore.close_all(server._map)  # the listening socket too: refuse, do not hang
        except Exception:  # noqa: BLE001 -- already failing: close what can be closed
            log.debug("closing the failed server's sockets", exc_info=True)
        log.critical("the HTTP server on %s stopped serving: its loop failed %d times within %.0fs, the last "
                     "with %s: %s. It refuses connections now; restart the process (HttpServer.wait raises "
                     "HttpServerFailed)", self.url, len(self._failures), _RESTART_WINDOW, type(exc).__name__, exc,
                     exc_info=exc)
        if self.on_failure is not None:
            try:
                self.on_failure(exc)
            except Exception:  # noqa: BLE001 -- the hook's own failure must not hide the server's
                log.exception("on_failure hook of the HTTP server raised")
        if self._ends_process():
            _exit_process(f"the HTTP server on {self.url} stopped serving and nothing waits on it "
                          "(HttpServer.wait) or handles it (on_failure)")

    def _ends_process(self) -> bool:
        """Whether this failure must end the process (see ``exit_on_failure``)."""
        if self.exit_on_failure is not None:
            return self.exit_on_failure
        if self.on_failure is not None:
            return False
        deadline = time.monotonic() + _WAITER_GRACE
        while True:
            with self._waiters_lock:
                if self._waiters:
                    return False  # wait() raises in that thread: the application ends the process
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.05)

    def _listener_error(self, server: Any) -> None:
        """An exception while accepting a connection: that connection is lost, the listening socket
        stays open (wasyncore's default closes it, and the service would never answer again)."""
        log.error("the HTTP server on %s failed to accept a connection; going on", self.url, exc_info=True)

    def _maintenance(self, server: Any, waitress_maintenance: Callable[[float], None], now: float) -> None:
        """waitress's (idle connections past ``channel_timeout``), then requests past their deadline."""
        waitress_maintenance(now)
        clock = time.monotonic()
        for channel in list(server.active_channels.values()):
            overdue = getattr(channel, "request_overdue", None)
            if overdue is not None and not channel.will_close and overdue(clock, self.request_timeout,
                                                                          self.request_min_rate):
                channel.will_close = True
                self.slow_requests_closed += 1
                log.debug("closing %s: its request did not arrive within %gs", channel.addr, self.request_timeout)

    # -- waiting and stopping ----------------------------------------------------------------------

    def wait(self, stop: threading.Event | None = None, timeout: float | None = None) -> bool:
        """Block until ``stop`` is set or the server is stopped (True), or ``timeout`` passes (False).

        Raises :class:`HttpServerFailed` as soon as the server gave up serving:
        uncaught, it ends the process with an error, which is what a supervisor
        restarts.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._waiters_lock:
            self._waiters += 1
        try:
            while True:
                if self.failure is not None:
                    raise HttpServerFailed(f"the HTTP server on {self.url} stopped serving: "
                                           f"{type(self.failure).__name__}: {self.failure}") from self.failure
                if (stop is not None and stop.is_set()) or (self._ended.is_set() and self._stopping):
                    return True
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                self._ended.wait(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic())))
        finally:
            with self._waiters_lock:
                self._waiters -= 1

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listening socket and every connection, and stop waitress's threads."""
        server, self._server = self._server, None
        if server is None:
            return
        from waitress import wasyncore

        self._stopping = True
        done = threading.Event()

        def close_everything() -> None:  # runs in the server's own loop thread
            wasyncore.close_all(server._map)
            done.set()

        if self._thread is not None and self._thread.is_alive():
            try:
                server.trigger.pull_trigger(close_everything)
            except OSError:
                wasyncore.close_all(server._map)
            done.wait(timeout)
        else:  # the loop is not running (it failed): nobody else will close them
            wasyncore.close_all(server._map)
        if self._thread is not None:
            self._thread.join(timeout)
        self._ended.set()
        server.task_dispatcher.shutdown(timeout=timeout)
        log.info("stopped serving on port %s", self._port)

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _exit_process(why: str) -> None:
    """End the process at once with :data:`EXIT_STATUS`, for its supervisor to start a fresh one.

    ``os._exit``: the main thread is blocked elsewhere and cannot be told, and
    nothing owed is lost (the store keeps it; a new process resumes from it,
    as after a crash).  The log handlers are flushed first so the reason is read.
    """
    log.critical("%s: ending process %d with status %d so that its supervisor starts a fresh one "
                 "(HttpServer(exit_on_failure=False), or an on_failure hook, to handle it otherwise)",
                 why, os.getpid(), EXIT_STATUS)
    for stream in [*logging.getLogger().handlers, *log.handlers, sys.stderr, sys.stdout]:
        try:
            stream.flush()
        except Exception:  # noqa: BLE001,S110 -- exiting anyway
            pass
    os._exit(EXIT_STATUS)


def _soft_nofile() -> str:
    try:
        import resource

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "a limited number of"
