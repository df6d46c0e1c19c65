"""The delivery pause: an outage of what the service depends on is not a poison message.

Two parts.  :func:`is_outage` says whether an exception is the kind a
dependency's outage raises (a connection refused or lost, a database
unavailable, SQLite busy past its timeout, a timeout, the store unavailable),
steered by the policy (``RMPolicy.outage_errors`` and ``is_outage``, beside
NServiceBus's and WCF's equivalents in the policy page).  :class:`DeliveryPause`
runs the service machine (:mod:`wsrm_plugin.statemachine.outage`) with what
it needs beside the mode: since when delivery is paused, the last error, the
probe back-off, and telling people (one WARNING when delivery pauses, one
INFO when it resumes) and the store (``wsrm status`` is another process).
Which messages were suspected or put off is the invoker's ledger's business;
this module knows nothing of messages.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txmanager.xa import XA_RBCOMMFAIL, XA_RBTRANSIENT, XAER_RMFAIL, XAException

from ..statemachine import ServiceAction, ServiceEvent, ServiceMode, service_transition
from ..store import NodeCondition, StorageManager, StoreUnavailableError
from .policy import RMPolicy

__all__ = ["DeliveryPause", "PauseRecord", "PauseReport", "default_outage", "is_outage"]

log = logging.getLogger(__name__)

#: How many causes of an exception are looked at (``__cause__``, ``__context__``, ``.cause``).
_CHAIN_LIMIT = 10
_OUTAGE_XA_CODES = frozenset({XAER_RMFAIL, XA_RBCOMMFAIL, XA_RBTRANSIENT})


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what caused it, nearest first: a wrapper (the spyne adapter's failure, a
    transaction manager's rollback) must not hide the database's own error."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(seen) < _CHAIN_LIMIT:
        current = todo.pop(0)
        if any(current is known for known in seen):
            continue
        seen.append(current)
        todo += [e for e in (current.__cause__, getattr(current, "cause", None), current.__context__)
                 if isinstance(e, BaseException)]
    return seen


def default_outage(exc: BaseException) -> bool:
    """The exceptions that mean "a dependency is down" whatever the application.

    Connections refused, reset or lost and timeouts (``ConnectionError``,
    ``TimeoutError``); ``psycopg2.OperationalError`` and psycopg 3's (the
    server gone, a connection lost, a statement cancelled); SQLite "database
    is locked/busy" past its timeout; an XA resource unavailable or its
    communication failed; the message store's own :class:`StoreUnavailableError`.
    """
    if isinstance(exc, (StoreUnavailableError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return "locked" in text or "busy" in text
    if isinstance(exc, XAException):
        return exc.code in _OUTAGE_XA_CODES
    for driver in ("psycopg2", "psycopg"):
        module = sys.modules.get(driver)  # only a driver the application imported can have raised
        operational = getattr(module, "OperationalError", None)
        if isinstance(operational, type) and isinstance(exc, operational):
            return True
    return False


def is_outage(exc: BaseException, policy: RMPolicy) -> bool:
    """Did ``exc`` (or what caused it) come from a dependency being down?

    For each exception in the chain, nearest first: the policy's predicate
    decides when it answers True or False (None: no opinion); then the
    policy's ``outage_errors`` and :func:`default_outage` say yes.
    """
    for error in _chain(exc):
        if policy.is_outage is not None:
            verdict = policy.is_outage(error)
            if verdict is not None:
                return bool(verdict)
        if policy.outage_errors and isinstance(error, policy.outage_errors):
            return True
        if default_outage(error):
            return True
    return False


@dataclass(frozen=True)
class PauseRecord:
    """What :class:`DeliveryPause` tells the store when its mode changes (for ``wsrm status``)."""

    service: str
    mode: ServiceMode
    #: When delivery paused (epoch seconds); None while running.
    since: float | None
    error: str | None
    probes: int
    #: Seconds until the next probe may go (while paused).
    next_probe_in: float = 0.0


class PauseReport:
    """The pause as ``wsrm status`` and the metrics see it (another process): a node condition of
    kind ``delivery-paused`` in the store, put while delivery is paused and removed when it
    resumes, when the engine stops, and when its successor starts (the process may have died
    paused).  ``reporter`` names this process (engine name and host)."""

    def __init__(self, store: StorageManager, reporter: str) -> None:
        self.store = store
        self.reporter = reporter

    def __call__(self, record: PauseRecord) -> None:
        kind, now = NodeCondition.DELIVERY_PAUSED, time.time()
        with self.store.begin() as tx:
            if not record.mode.paused:
                tx.conditions.remove(kind, reporter=self.reporter)
                return
            detail = (f"{record.probes} probe(s) failed, the next in {record.next_probe_in:.0f}s; "
                      f"{tx.invoker.count()} message(s) waiting")
            tx.conditions.put(NodeCondition(kind, record.service, self.reporter, record.mode.name.lower(),
                                            record.since or now, record.error, detail, now))

    def withdraw(self) -> None:
        try:
            with self.store.begin() as tx:
                tx.conditions.remove(NodeCondition.DELIVERY_PAUSED, reporter=self.reporter)
        except Exception as exc:  # noqa: BLE001 -- the store is down: the next report replaces it
            log.debug("could not withdraw the reported delivery pause: %s", exc)


class DeliveryPause:
    """The service machine of one engine, with its clock, back-off and reporting.

    Thread-safe: every invoker thread reports its outcomes here.  Each method
    returns the machine's actions for the caller to do the message side of
    them (charge or absorb the suspects, bring put-off attempts forward); the
    logging, the back-off and the store record are done here.
    """

    def __init__(self, policy: RMPolicy, service: str, *, record: Callable[[PauseRecord], None] = lambda r: None,
                 wake: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log) -> None:
        self.policy = policy
        self._log = logger
        self.service = service
        self._record = record
        self._wake = wake
        self._clock = clock
        self._lock = threading.Lock()
        self.mode = ServiceMode.initial()
        #: When delivery paused (epoch seconds), the error that paused it or the last probe's.
        self.since: float | None = None
        self.error: str | None = None
        self.probes = 0
        self._next_probe = 0.0
        self._delay = policy.outage_probe_delay
        #: Deliveries failed the way an outage fails since one last succeeded (reset by a pause).
        self._in_a_row = 0
        #: Pauses since start (for tests and operators).
        self.pauses = 0

    @property
    def paused(self) -> bool:
        return self.mode.paused

    def delivered(self) -> tuple[ServiceAction, ...]:
        if self.mode is ServiceMode.RUNNING:  # every delivery passes here: no lock while all is well
            return ()
        return self._event(ServiceEvent.DELIVERED)

    def failed(self) -> tuple[ServiceAction, ...]:
        """A delivery failed on the message's own account (counted)."""
        if self.mode is ServiceMode.RUNNING:
            return ()
        return self._event(ServiceEvent.FAILED)

    def outage(self, error: BaseException) -> tuple[ServiceAction, ...]:
        """A delivery (or a claim) failed the way an outage fails."""
        return self._event(ServiceEvent.OUTAGE, error)

    def take_probe(self) -> bool:
        """While paused: True for the one caller that may deliver one message now."""
        with self._lock:
            if self.mode is not ServiceMode.PAUSED or self._clock() < self._next_probe:
                return False
            self.mode = service_transition(self.mode, ServiceEvent.PROBE_DUE).state
            self.probes += 1
            return True

    def probe_ended_empty(self) -> None:
        """The probe found nothing to deliver (or only messages not due yet): the next one soon,
        without growing the back-off (a message put off by the last probe comes due right after
        the next probe time, so that a probe tries another message first where there is one)."""
        with self._lock:
            if self.mode is ServiceMode.PROBING:
                self.mode = service_transition(self.mode, ServiceEvent.PROBE_EMPTY).state
                self._next_probe = self._clock() + min(self._delay, self.policy.poll_interval)

    def nothing_waiting(self) -> tuple[ServiceAction, ...]:
        """The probe found nothing to deliver and nothing this pause put off: resume."""
        if self.mode is not ServiceMode.PROBING:
            return ()
        return self._event(ServiceEvent.NOTHING_WAITING)

    def next_probe_in(self) -> float:
        """Seconds until the next probe may go (0 when not paused)."""
        return max(0.0, self._next_probe - self._clock()) if self.paused else 0.0

    def _jittered(self, delay: float) -> float:
        # a quarter of jitter below the delay: probes of several processes spread out, never beyond the cap
        return delay * random.uniform(0.75, 1.0)  # noqa: S311 -- not cryptography

    def _event(self, event: ServiceEvent, error: BaseException | None = None) -> tuple[ServiceAction, ...]:
        with self._lock:
            if event is ServiceEvent.OUTAGE:
                self._in_a_row += 1
                if self._in_a_row >= self.policy.pause_after_outage_failures or self.mode.paused:
                    event = ServiceEvent.OUTAGES_IN_A_ROW
            result = service_transition(self.mode, event)
            self.mode = result.state
            if self.mode is ServiceMode.RUNNING or ServiceAction.PAUSE in result.actions:
                self._in_a_row = 0
            actions = tuple(a for a in result.actions if isinstance(a, ServiceAction))
            if error is not None and self.mode.paused:
                self.error = f"{type(error).__name__}: {error}"
            if ServiceAction.PAUSE in actions:
                self.since, self.probes, self.pauses = time.time(), 0, self.pauses + 1
                self.error = f"{type(error).__name__}: {error}" if error is not None else self.error
                self._delay = self.policy.outage_probe_delay
                self._next_probe = self._clock() + self._jittered(self._delay)
            elif ServiceAction.BACK_OFF in actions:
                self._delay = min(self._delay * 2, self.policy.max_outage_probe_delay)
                self._next_probe = self._clock() + self._jittered(self._delay)
            record = self._snapshot() if actions and actions[0] in (
                ServiceAction.PAUSE, ServiceAction.RESUME, ServiceAction.BACK_OFF) else None
            since, probes = self.since, self.probes
            if ServiceAction.RESUME in actions:
                self.since, self.error = None, None
        if ServiceAction.PAUSE in actions:
            self._log.warning("delivery to %s PAUSED: %d deliveries in a row failed as an outage fails "
                              "(%s); no attempt is counted against any message; one message is tried every "
                              "%g-%g s until one succeeds", self.service, self.policy.pause_after_outage_failures,
                              self.error, self.policy.outage_probe_delay, self.policy.max_outage_probe_delay)
        elif ServiceAction.RESUME in actions:
            self._log.info("delivery to %s RESUMED after %.1f s paused (%d probe(s) failed)", self.service,
                     time.time() - (since or time.time()), max(0, probes - 1))
            self._wake()
        elif ServiceAction.BACK_OFF in actions:
            self._log.debug("delivery to %s still paused: the probe failed (%s); next in %.1f s",
                      self.service, self.error, self._delay)
        if record is not None:
            if ServiceAction.RESUME in actions:
                record = PauseRecord(self.service, ServiceMode.RUNNING, None, None, record.probes)
            self._write(record)
        return actions

    def _snapshot(self) -> PauseRecord:
        return PauseRecord(self.service, self.mode, self.since, self.error, self.probes,
                           max(0.0, self._next_probe - self._clock()))

    def _write(self, record: PauseRecord) -> None:
        try:
            self._record(record)
        except Exception as exc:  # noqa: BLE001 -- the store may be what is down; the log said it
            log.debug("could not record the delivery state of %s in the store: %s", self.service, exc)

    def status(self) -> dict[str, Any]:
        """``paused``, ``paused_since``, ``pause_error`` as the engine's status shows them."""
        with self._lock:
            return {"paused": self.mode.paused, "paused_since": self.since if self.mode.paused else None,
                    "pause_error": self.error if self.mode.paused else None}
