"""An outage of what the service depends on pauses delivery; it is not a poison message (issue 30).

The application here stands for a service whose database is down while ``down`` is set: it raises
what a dead database raises (a refused connection).  Deliveries of different messages failing that
way pause delivery: nothing is counted against any message, one message is tried at a time on a
capped back-off, and the first success resumes delivery at full speed.  A message that fails while
others are delivered is still a poison message (its attempts, cycles, the poison store).  Real
engines on loopback HTTP; each test takes a few seconds.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

import psycopg2
import pytest

from txmanager.errors import RollbackError
from txmanager.xa import XA_RBDEADLOCK, XAER_RMFAIL, XAException
from wsrm_plugin.engine import ApplicationFault
from wsrm_plugin.engine.outage import default_outage, is_outage
from wsrm_plugin.metrics import exposition
from wsrm_plugin.status import format_report, report
from wsrm_plugin.store import StoreUnavailableError

from .conftest import fast_policy
from .support import ACTION, item_text, payload, wait_for

INVOKER = "wsrm_plugin.engine.invoker"


class Dependency:
    """An application whose database is down while ``down`` is set (thread-safe)."""

    def __init__(self, error: type[BaseException] = ConnectionRefusedError, bad: str | None = None) -> None:
        self.down = threading.Event()
        self.error = error
        self.bad = bad  # the one message that always fails, database or not
        self.calls: dict[str, int] = {}
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, envelope: bytes, context: object) -> None:
        text = item_text(envelope) or ""
        with self._lock:
            self.calls[text] = self.calls.get(text, 0) + 1
        if self.down.is_set() or text == self.bad:
            raise self.error("connection to the database refused")
        with self._lock:
            self.seen.append(text)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.seen)


def _send(client, server, keys: list[str], per_key: int) -> dict[str, list[str]]:
    """``per_key`` messages on each of ``keys`` (one sequence each), interleaved."""
    sent: dict[str, list[str]] = {key: [] for key in keys}
    for i in range(per_key):
        for key in keys:
            text = f"{key}-{i:02d}"
            client.send(server.endpoint_address, payload(text), action=ACTION, key=key)
            sent[key].append(text)
    return sent


def _per_key(seen: list[str], key: str) -> list[str]:
    return [text for text in seen if text.startswith(f"{key}-")]


def _log(caplog, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and text in r.getMessage()]


@pytest.mark.parametrize("keys", [["a", "b", "c", "d"], ["a"]], ids=["four-sequences", "one-sequence"])
def test_an_outage_pauses_delivery_counts_nothing_and_the_first_success_resumes_it(
        engines, store_for, caplog, keys):
    caplog.set_level(logging.INFO, logger=INVOKER)
    app = Dependency()
    policy = fast_policy(max_delivery_attempts=2, delivery_retry_delay=0.05, max_retry_cycles=0,
                         outage_probe_delay=0.2, max_outage_probe_delay=1.0, invoker_threads=2)
    server = engines(store_for("sqlite", "s"), policy, serve=True, application=app, name="orders")
    client = engines(store_for("memory", "c"), name="client")
    app.down.set()
    sent = _send(client, server, keys, 6)

    # every message is received and acknowledged although none can be processed
    assert wait_for(lambda: client.status().unacked == 0, timeout=60), client.status()
    assert wait_for(lambda: server.status().paused, timeout=30), server.status()
    time.sleep(3 * policy.max_outage_probe_delay)  # several probes fail meanwhile
    status = server.status()
    assert status.paused and status.paused_since is not None and status.paused_since <= time.time()
    assert "ConnectionRefusedError" in (status.pause_error or "")
    assert status.waiting == status.buffered == 6 * len(keys)
    # two attempts and no cycle would have poisoned them long ago: nothing was counted
    assert status.poisoned == 0 and status.retrying == 0 and status.delivery_failures == 0
    assert app.snapshot() == []
    # the store says so, for `wsrm status` in another process
    [recorded] = report(server.store).paused_delivery
    assert recorded.subject == "orders" and recorded.reporter.startswith("orders@")
    assert recorded.state in ("paused", "probing") and "refused" in (recorded.last_error or "")
    assert f"{6 * len(keys)} message(s) waiting" in recorded.detail
    shown = format_report(report(server.store))
    assert "DELIVERY PAUSED: orders since" in shown and "refused" in shown, shown
    metrics = exposition(report(server.store))
    assert "wsrm_delivery_paused 1\n" in metrics and 'wsrm_delivery_paused_since_seconds{service="orders"' in metrics
    assert f"wsrm_delivery_waiting_messages {6 * len(keys)}\n" in metrics

    app.down.clear()
    back = time.monotonic()
    everything = [text for texts in sent.values() for text in texts]
    assert wait_for(lambda: sorted(app.snapshot()) == sorted(everything), timeout=30), app.snapshot()
    recovered = time.monotonic() - back
    print(f"{len(keys)} sequence(s): the last delivery {recovered:.2f} s after the dependency came back")
    assert recovered < policy.max_outage_probe_delay + 5
    for key in keys:
        assert _per_key(app.snapshot(), key) == sent[key]  # in order, each once
    status = server.status()
    assert not status.paused and status.pause_error is None and status.waiting == 0
    assert status.poisoned == 0 and status.retrying == 0
    assert wait_for(lambda: not report(server.store).paused_delivery)
    assert "wsrm_delivery_paused 0\n" in exposition(report(server.store))
    # told once each way, not a line per attempt
    assert len(_log(caplog, logging.WARNING, "PAUSED")) == 1
    assert len(_log(caplog, logging.INFO, "RESUMED")) == 1
    assert not _log(caplog, logging.WARNING, "delivery attempt")


def test_a_message_that_fails_like_an_outage_while_others_are_delivered_is_still_poison(engines, store_for):
    # the one bad message raises what an outage raises; the other sequence keeps being delivered
    app = Dependency(bad="a-01")
    failures = []
    policy = fast_policy(max_delivery_attempts=2, delivery_retry_delay=0.1, max_retry_cycles=1,
                         retry_cycle_delay=0.3, poison_handling="continue", invoker_threads=2)
    server = engines(store_for("sqlite", "s"), policy, serve=True, application=app,
                     on_delivery_failure=failures.append)
    client = engines(store_for("memory", "c"))
    for i in range(3):
        client.send(server.endpoint_address, payload(f"a-{i:02d}"), action=ACTION, key="a")
    stop = threading.Event()

    def others() -> None:  # a steady stream on another sequence: the service visibly works
        i = 0
        while not stop.is_set():
            client.send(server.endpoint_address, payload(f"b-{i:03d}"), action=ACTION, key="b")
            i += 1
            time.sleep(0.05)

    stream = threading.Thread(target=others, daemon=True)
    stream.start()
    try:
        assert wait_for(lambda: failures, timeout=60), (app.calls.get("a-01"), server.status())
    finally:
        stop.set()
        stream.join()
    [failure] = failures
    assert item_text(failure.payload) == "a-01"
    [kept] = server.poison_messages()
    assert kept.total_attempts == 4 and kept.cycles == 2  # 2 attempts x 2 cycles, as for any poison
    assert wait_for(lambda: "a-02" in app.snapshot())  # continue: the rest goes on without it
    assert _per_key(app.snapshot(), "a") == ["a-00", "a-02"]


@pytest.mark.parametrize("threshold", [1, 3])
def test_the_pause_comes_after_the_configured_number_of_outage_failures_in_a_row(
        engines, store_for, caplog, threshold):
    # one message, its dependency down: each failure before the threshold is only a suspicion (not
    # counted, tried again after its retry delay), the threshold's one pauses; two attempts and no
    # cycle would have poisoned it at its second counted failure
    caplog.set_level(logging.INFO, logger=INVOKER)
    app = Dependency()
    policy = fast_policy(max_delivery_attempts=2, delivery_retry_delay=0.2, max_retry_cycles=0,
                         outage_probe_delay=30.0, max_outage_probe_delay=30.0, invoker_threads=1,
                         pause_after_outage_failures=threshold)
    server = engines(store_for("memory", "s"), policy, serve=True, application=app, name="orders")
    client = engines(store_for("memory", "c"), name="client")
    app.down.set()
    _send(client, server, ["a"], 1)
    assert wait_for(lambda: server.status().paused, timeout=30), (app.calls, server.status())
    # no probe before 22.5 s (30 s less a quarter of jitter): the calls so far are those that paused it
    assert app.calls == {"a-00": threshold}
    status = server.status()
    assert status.poisoned == 0 and status.retrying == 0 and status.delivery_failures == 0
    # the mode turns paused under the monitor's lock and the warning is written just after it
    assert wait_for(lambda: _log(caplog, logging.WARNING, "PAUSED"), timeout=30)
    [warning] = _log(caplog, logging.WARNING, "PAUSED")
    assert f"{threshold} deliveries in a row failed as an outage fails" in warning
    assert len(_log(caplog, logging.INFO, "not counted unless another message is delivered")) == threshold - 1


def test_without_pause_on_outage_every_failure_counts_as_before(engines, store_for):
    app = Dependency()
    failures = []
    policy = fast_policy(max_delivery_attempts=2, delivery_retry_delay=0.05, max_retry_cycles=0,
                         pause_on_outage=False, poison_handling="continue")
    server = engines(store_for("memory", "s"), policy, serve=True, application=app,
                     on_delivery_failure=failures.append)
    client = engines(store_for("memory", "c"))
    app.down.set()
    _send(client, server, ["a"], 2)
    assert wait_for(lambda: len(failures) == 2, timeout=30), server.status()
    assert not server.status().paused and server.status().poisoned == 2


def test_the_application_steers_what_is_an_outage(engines, store_for):
    # a ConnectionError the application says is its own (the predicate says False): counted
    app = Dependency()
    failures = []
    policy = fast_policy(max_delivery_attempts=2, delivery_retry_delay=0.05, max_retry_cycles=0,
                         poison_handling="continue",
                         is_outage=lambda exc: False if isinstance(exc, ConnectionError) else None)
    server = engines(store_for("memory", "s"), policy, serve=True, application=app,
                     on_delivery_failure=failures.append)
    client = engines(store_for("memory", "c"))
    app.down.set()
    _send(client, server, ["a", "b"], 1)
    assert wait_for(lambda: len(failures) == 2, timeout=30), server.status()
    assert not server.status().paused

    # and its own exception type counts as one (outage_errors)
    class LedgerOffline(Exception):
        pass

    app2 = Dependency(error=LedgerOffline)
    server2 = engines(store_for("memory", "s2"), fast_policy(outage_errors=(LedgerOffline,), max_retry_cycles=0,
                                                             max_delivery_attempts=2),
                      serve=True, application=app2)
    app2.down.set()
    _send(client, server2, ["c", "d"], 1)
    assert wait_for(lambda: server2.status().paused, timeout=30), server2.status()
    assert server2.status().poisoned == 0
    app2.down.clear()
    assert wait_for(lambda: len(app2.snapshot()) == 2, timeout=30)


def test_a_receive_during_a_pause_is_acknowledged_and_buffered_not_run(engines, store_for):
    app = Dependency()
    policy = fast_policy(deliver_on_receive=True, outage_probe_delay=0.5, max_outage_probe_delay=3.0)
    server = engines(store_for("sqlite", "s"), policy, serve=True, application=app)
    client = engines(store_for("memory", "c"))
    app.down.set()
    _send(client, server, ["a", "b"], 2)
    assert wait_for(lambda: server.status().paused, timeout=30)
    _send(client, server, ["c"], 5)  # next in order on a new sequence: would be run on receipt
    assert wait_for(lambda: client.status().unacked == 0, timeout=30)
    # acknowledged without running the application in the receiving thread: at most a probe ran
    assert sum(app.calls.get(f"c-{i:02d}", 0) for i in range(5)) <= 1, app.calls
    assert server.status().delivered_on_receipt == 0 and server.status().buffered == 9
    app.down.clear()
    assert wait_for(lambda: len(app.snapshot()) == 9, timeout=30), app.snapshot()


def test_a_declared_fault_is_never_an_outage_and_causes_are_looked_through():
    policy = fast_policy()
    assert not is_outage(ApplicationFault(b"<f/>"), policy)
    assert is_outage(ConnectionResetError("reset by peer"), policy)
    assert is_outage(TimeoutError("timed out"), policy)
    assert is_outage(StoreUnavailableError("disk full"), policy)
    assert is_outage(psycopg2.OperationalError("server closed the connection unexpectedly"), policy)
    assert is_outage(sqlite3.OperationalError("database is locked"), policy)
    assert not is_outage(sqlite3.OperationalError("no such table: orders"), policy)  # a bug, not an outage
    assert is_outage(XAException(XAER_RMFAIL, "cannot connect"), policy)
    assert not is_outage(XAException(XA_RBDEADLOCK, "deadlock"), policy)
    assert not is_outage(RuntimeError("a bug"), policy) and not is_outage(KeyError("x"), policy)
    # a wrapper does not hide the database's own error: raise ... from, implicit context, .cause
    try:
        try:
            raise psycopg2.OperationalError("the database system is shutting down")
        except psycopg2.Error as exc:
            raise RuntimeError("the service failed to process the message") from exc
    except RuntimeError as wrapped:
        assert is_outage(wrapped, policy)
    assert is_outage(RollbackError("rolled back", cause=ConnectionRefusedError()), policy)
    assert default_outage(ConnectionRefusedError()) and not default_outage(ValueError())
    # the predicate is asked first, the types after
    says_no = fast_policy(is_outage=lambda exc: False)
    assert not is_outage(ConnectionRefusedError(), says_no)
    assert is_outage(KeyError("ledger"), fast_policy(outage_errors=(KeyError,)))
