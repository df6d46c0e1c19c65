"""Is this node able to work?  Liveness and readiness, as Kubernetes probes and haproxy checks ask.

::

    GET /healthz/live    200 {"status": "pass", ...}   the process works: restart it otherwise
    GET /healthz/ready   200 or 503                     send it traffic, or not now

A reliable service answers both (:class:`HealthRoutes` in front of its WSGI
app; ``reliable_service(..., health_path=None)`` leaves them out).  The body
is JSON in the shape of the IETF's health check response format
(``application/health+json``): an overall ``status`` of ``pass``, ``warn``
or ``fail`` and one entry per check with its own status and what it saw.
``fail`` answers 503, ``pass`` and ``warn`` 200.

**Liveness** checks only what a restart would cure, and never the store (a
database outage must not make an orchestrator restart every replica):

* ``workers``: every worker thread of a started engine is alive, and none
  has been inside one step for longer than ``stuck_after`` seconds (a
  deadlock, a peer hanging without a timeout);
* ``node``: with a node name claimed in the database (several hosts,
  ``txmanager.nodes.PostgresNodes``), the session holding the claim still
  works.  Once it failed another host may hold the name: this process can
  decide no XA transaction any more, and a restart claims a name anew.  It
  fails readiness too.
* ``servers``: the built-in HTTP servers the engine or the service started
  (``serve()``) still serve.  One whose loop kept failing gave up and closed
  its socket (:mod:`wsrm_plugin.engine.http_server`): a probe through it is
  refused anyway, but a probe through another server (the service served by
  gunicorn, the engine's own endpoint by the built-in one) must hear it too,
  for the short while before the server ends the process (or for good, with
  ``exit_on_failure=False``).

**Readiness** checks what traffic needs now:

* ``store``: the store answered a status read within ``store_timeout``
  seconds (a PostgreSQL store whose server is down or unreachable fails);
* ``recovery``: the start-up pass (transaction recovery, resumption of the
  sequences in flight) is done and the engine's workers run;
* ``delivery``: delivery to the application is not paused (the engine
  pauses it while the application's own database is down; received
  messages then wait in the store);
* ``poison``: messages given up after every retry wait for an operator
  (``wsrm poison``).  A warning by default, not a failure: every replica
  shares the store, so failing readiness would take them all out of the
  load balancer for one bad message; ``max_poison=N`` fails beyond N.
* ``peers``: the peers this process sends to (a client's reply endpoint, a
  service it calls) that the sender judged unreachable
  (:mod:`wsrm_plugin.engine.reachability`: its circuit breaker is open, one
  probe at a time goes there).  Degraded, not unready, by default: the
  service still takes and delivers messages, the ones for that peer wait in
  the store and go at once when it answers, and every replica would see the
  same peer down (failing readiness would take them all out of the load
  balancer because of someone else's outage; the health groups of Spring
  Boot and Kubernetes' advice keep such a dependency out of readiness);
  ``max_unreachable_peers=N`` fails beyond N.

A readiness answer is reused for ``min_interval`` seconds, so that probes
from several checkers (haproxy every 2 s, kubelet every 10 s) cost one store
read between them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Check", "HealthReport", "NodeHealth", "HealthRoutes", "CONTENT_TYPE", "peers_check"]

log = logging.getLogger(__name__)

#: The media type of the IETF health check response format.
CONTENT_TYPE = "application/health+json"

_RANK = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class Check:
    """One check: its name, ``pass``/``warn``/``fail``, and what it saw (for a person)."""

    name: str
    status: str
    output: str = ""
    observed: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthReport:
    """The checks of one probe; ``status`` is the worst of them."""

    checks: tuple[Check, ...]

    @property
    def status(self) -> str:
        return max((c.status for c in self.checks), key=_RANK.__getitem__, default="pass")

    @property
    def ok(self) -> bool:
        """Not failing (``pass`` or ``warn``): what answers 200."""
        return self.status != "fail"

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status,
                "checks": {c.name: {"status": c.status, "output": c.output, **c.observed} for c in self.checks}}


class NodeHealth:
    """The liveness and readiness of one engine (a reliable service's, or a client's).

    ``recovered()`` says whether the node's start-up pass is done (a
    :class:`~wsrm_plugin.lifecycle.LifecycleListener` report exists).
    """

    def __init__(self, engine: Any, recovered: Callable[[], bool], *, max_poison: int | None = None,
                 store_timeout: float = 2.0, stuck_after: float | None = None, min_interval: float = 1.0,
                 servers: Callable[[], Iterable[Any]] | None = None,
                 max_unreachable_peers: int | None = None) -> None:
        if store_timeout <= 0:
            raise ValueError(f"store_timeout must be > 0 seconds, not {store_timeout!r}")
        for name, value in (("max_poison", max_poison), ("max_unreachable_peers", max_unreachable_peers)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"{name} must be an int >= 0 or None (only warn), not {value!r}")
        self.engine = engine
        self.recovered = recovered
        self.max_poison = max_poison
        self.max_unreachable_peers = max_unreachable_peers
        self.store_timeout = store_timeout
        #: a step longer than this is stuck: well beyond the longest a healthy one takes (an HTTP
        #: timeout per message of a round, a slow delivery)
        self.stuck_after = stuck_after if stuck_after is not None else max(120.0, 10 * engine.policy.http_timeout)
        self.min_interval = min_interval
        #: The built-in HTTP servers to watch (default: the engine's, ``engine.servers``).
        self.servers = servers if servers is not None else (lambda: getattr(engine, "servers", ()))
        self._lock = threading.Lock()
        self._probe: threading.Thread | None = None
        self._probe_result: tuple[Any, BaseException | None] | None = None
        self._probe_done = threading.Event()
        self._ready: tuple[float, HealthReport] | None = None

    # -- liveness -------------------------------------------------------------------------------

    def liveness(self) -> HealthReport:
        checks = (self._workers_check(), self._node_check(), self._servers_check())
        return HealthReport(tuple(c for c in checks if c is not None))

    def _servers_check(self) -> Check | None:
        """The built-in HTTP servers started for this engine (none: no check)."""
        servers = list(self.servers())
        if not servers:
            return None
        failed = [s for s in servers if getattr(s, "failure", None) is not None]
        if failed:
            what = "; ".join(f"{s.url}: {type(s.failure).__name__}: {s.failure}" for s in failed)
            return Check("servers", "fail", f"the built-in HTTP server stopped serving ({what}): restart the process",
                         {"failed": [s.url for s in failed]})
        return Check("servers", "pass", f"{len(servers)} HTTP server(s) serving")

    def _node_check(self) -> Check | None:
        """The claim on the node name, when the transaction manager's log holds one in a database."""
        log_ = getattr(getattr(self.engine, "tm", None), "log", None)
        lost = getattr(log_, "claim_lost", None)
        if not callable(lost):
            return None
        node = getattr(log_, "node", None) or getattr(getattr(log_, "database", None), "node", "?")
        why = lost()
        if why is not None:
            why_text = " ".join(str(why).split())
            return Check("node", "fail", f"lost its claim on node {node} ({why_text}): another host may hold it; "
                                         "restart the process to claim a node again", {"node": node})
        return Check("node", "pass", f"holds node {node}", {"node": node})

    def _workers_check(self) -> Check:
        engine = self.engine
        if not engine.started:
            return Check("workers", "pass", "the engine is not started (nothing to run)")
        now = time.monotonic()
        dead = [w.name for w in engine.workers if not w.running]
        stuck = [w.name for w in engine.workers
                 if w.busy_since is not None and now - w.busy_since > self.stuck_after]
        if dead or stuck:
            what = "; ".join(filter(None, [f"not running: {', '.join(dead)}" if dead else "",
                                           f"stuck in one step for over {self.stuck_after:g} s: {', '.join(stuck)}"
                                           if stuck else ""]))
            return Check("workers", "fail", what, {"dead": dead, "stuck": stuck})
        return Check("workers", "pass", f"{len(engine.workers)} worker threads alive")

    # -- readiness ------------------------------------------------------------------------------

    def readiness(self) -> HealthReport:
        with self._lock:
            if self._ready is not None and time.monotonic() - self._ready[0] < self.min_interval:
                return self._ready[1]
        report = HealthReport(tuple(self._readiness_checks()))
        with self._lock:
            self._ready = (time.monotonic(), report)
        return report

    def _readiness_checks(self) -> Iterable[Check]:
        engine = self.engine
        node = self._node_check()
        if node is not None:
            yield node
        if self.recovered() and engine.started:
            yield Check("recovery", "pass", "start-up recovery done, workers running")
        else:
            yield Check("recovery", "fail", "starting: recovery or the workers' start not done yet")
        status, error = self._status_within(self.store_timeout)
        if status is None:
            yield Check("store", "fail", error or "the store did not answer")
            return  # what follows is read from the store
        yield Check("store", "pass", f"{type(engine.store).__name__} answered")
        if getattr(status, "paused", False):
            yield Check("delivery", "fail", f"delivery paused: {status.pause_error or 'the application failed'}",
                        {"paused_since": status.paused_since, "waiting": status.waiting})
        else:
            yield Check("delivery", "pass", "delivering", {"buffered": status.buffered})
        yield peers_check(getattr(status, "unreachable_peers", ()), self.max_unreachable_peers)
        poisoned = status.poisoned
        if not poisoned:
            yield Check("poison", "pass", "no poison messages")
        else:
            failing = self.max_poison is not None and poisoned > self.max_poison
            yield Check("poison", "fail" if failing else "warn",
                        f"{poisoned} poison message(s) wait for an operator (wsrm poison list)", {"poisoned": poisoned})

    def _status_within(self, timeout: float) -> tuple[Any, str | None]:
        """``engine.status()`` read in a probe thread, waited for ``timeout`` seconds at most.

        A store that hangs (a partitioned database server) must not hang the
        probe's HTTP thread: the probe goes on alone, and the next check waits
        for it rather than starting another.
        """
        with self._lock:
            if self._probe is None or not self._probe.is_alive():
                self._probe_done.clear()
                self._probe = threading.Thread(target=self._read_status, name="wsrm-health-probe", daemon=True)
                self._probe.start()
            done = self._probe_done
        if not done.wait(timeout):
            return None, f"the store did not answer within {timeout:g} s"
        with self._lock:
            result = self._probe_result
        if result is None:
            return None, "the store did not answer"
        status, error = result
        if error is not None:
            return None, f"the store cannot be read: {type(error).__name__}: {error}"
        return status, None

    def _read_status(self) -> None:
        try:
            result: tuple[Any, BaseException | None] = (self.engine.status(), None)
        except Exception as exc:  # noqa: BLE001 -- the check's answer, not an error of the probe
            result = (None, exc)
        with self._lock:
            self._probe_result = result
        self._probe_done.set()


def peers_check(unreachable: Iterable[Any], max_unreachable: int | None = None) -> Check:
    """The ``peers`` check from the sender's unreachable peers
    (:class:`~wsrm_plugin.engine.reachability.UnreachablePeer`): ``warn`` while any is
    unreachable, ``fail`` beyond ``max_unreachable`` (None: never)."""
    peers = list(unreachable)
    if not peers:
        return Check("peers", "pass", "every peer answers")
    failing = max_unreachable is not None and len(peers) > max_unreachable
    now = time.time()
    what = "; ".join(f"{p.address} since {max(0.0, now - p.since):.0f} s ({p.last_error}), "
                     f"{p.held} message(s) wait" for p in peers)
    return Check("peers", "fail" if failing else "warn",
                 f"{len(peers)} peer(s) unreachable, one probe at a time goes to each: {what}",
                 {"unreachable": [{"address": p.address, "since": p.since, "last_error": p.last_error,
                                   "probes": p.probes, "held": p.held} for p in peers]})


class HealthRoutes:
    """WSGI middleware answering ``GET``/``HEAD`` ``{path}/live`` and ``{path}/ready``; the rest goes to ``app``."""

    def __init__(self, app: Callable[..., Iterable[bytes]], health: NodeHealth, path: str = "/healthz") -> None:
        self.app = app
        self.health = health
        self.path = "/" + path.strip("/")

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if not path.startswith(self.path) or environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return self.app(environ, start_response)
        which = path[len(self.path):].strip("/")
        if which == "live":
            report = self.health.liveness()
        elif which in ("ready", ""):
            report = self.health.readiness()
        else:
            return self.app(environ, start_response)
        body = json.dumps(report.to_json(), separators=(",", ":")).encode() + b"\n"
        status = "200 OK" if report.ok else "503 Service Unavailable"
        if not report.ok:
            log.info("health %s: %s", which or "ready", body.decode().strip())
        start_response(status, [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body))),
                                ("Cache-Control", "no-store")])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]
