"""The scenario of the database-outage tests (issue 30): a reliable spyne service's own PostgreSQL
is stopped while 100 one-way and 20 in-out messages arrive on 4 sequences, and started again.

Shared by ``test_db_outage*.py`` (one file per duration, so that the long ones run side by side
under ``--dist loadfile``).  Each delivery is one XA transaction (the store's branch and the
database's); the store is SQLite, or PostgreSQL on the session's server.  What is checked:

* while the database is down every message is received and acknowledged, none is counted
  against its attempts (``retrying`` and ``poisoned`` stay 0) and the pause is readable from the
  store (``wsrm status`` shows DELIVERY PAUSED; the short outage reads the same report in this
  process, a ``wsrm`` process taking about as long to start as the outage lasts);
* after it: every message in the database exactly once, in order per sequence, every request
  answered, nothing left prepared; delivery resumed by a probe within the probe cap of the
  database's return (the RESUMED line's time), and the last delivery within 10 s of it on a quiet
  machine, measured by the database's own clock and printed.  What a loaded machine stretches is
  the delivery of the 120 messages after the resumption, not the pause: the last delivery is
  asserted within 30 s (the retry cycles the pause replaces took a minute and more).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any

import psycopg2

from tests.engine.support import wait_for
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.status import format_report, report
from wsrm_plugin.store import open_store
from wsrm_plugin.wire import parse_envelope

from . import service
from .conftest import Envelopes, action, fast_policy
from .test_poison import wsrm

#: 4 sequences: two of one-way messages (50 each), two of requests (10 each), interleaved.
ONE_WAY = {key: [f"{key}-{i:03d}" for i in range(50)] for key in ("r0", "r1")}
REQUESTS = {key: [f"{key}-{i:03d}" for i in range(10)] for key in ("e0", "e1")}
#: The target of issue 30: the last message delivered this soon after the database is back (a
#: quiet machine: printed, and what the resumption below is held to).
RECOVERY_TARGET = 10.0
#: What is asserted of the last delivery: on a loaded machine the 120 deliveries after the
#: resumption take longer (7 s in all at a load of 16 on 2 cores, where the target is 10 s).
RECOVERY_LIMIT = 30.0


class _Resumed(logging.Handler):
    """Notes when (epoch seconds) the invoker logged that delivery RESUMED."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "RESUMED" in record.getMessage():
            self.at.append(record.created)


@dataclass(frozen=True)
class Outcome:
    recovery: float  # seconds from the database's return to the last delivery (its own clock)
    pause_seen: str  # the status report that showed the pause


def _query(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn, connect_timeout=10)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def _items(dsn: str) -> list[str]:
    return [row[0] for row in _query(dsn, "SELECT item FROM orders ORDER BY id")]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _prepared(dsn: str) -> int:
    return _query(dsn, "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()")[0][0]


def policy(retry_cycle_delay: float | None = None) -> Any:
    """The retry policy left at WCF's defaults (3 attempts, 3 cycles 60 s apart: a 5-minute outage
    would poison every busy sequence's first message), the pause at its defaults; or with the
    cycles ``retry_cycle_delay`` apart, which a shorter outage outlasts the same way."""
    cycles = {} if retry_cycle_delay is None else {"retry_cycle_delay": retry_cycle_delay}
    return fast_policy(invoker_threads=2, **cycles)


def poisoned_after(policy: Any) -> float:
    """Seconds from a message's first failed delivery to the poison store, had the pause not held
    it: every attempt of every retry cycle, and the delays between them (about 122 s by default)."""
    cycle = sum(policy.delivery_retry_delay_after(attempts) for attempts in range(1, policy.max_delivery_attempts))
    return (policy.max_retry_cycles + 1) * cycle + policy.max_retry_cycles * policy.retry_cycle_delay


def run(servers, clients, app_pg, pg_dsn_factory, tmp_path, *, kind: str, seconds: float,
        cli: bool, retry_cycle_delay: float | None = None) -> Outcome:
    app_dsn = app_pg.create_database("orders")
    # the database stamps each row itself: the recovery time is measured by its clock, not ours
    _query(app_dsn, service.SCHEMA + "; ALTER TABLE orders ADD COLUMN at timestamptz "
                    "NOT NULL DEFAULT clock_timestamp(); SELECT 1")
    store_url = (f"sqlite:///{tmp_path}/server.db" if kind == "sqlite"
                 else f"postgresql:{pg_dsn_factory('outagestore')}")
    tm = TransactionManager(node="outage", log=tmp_path / "tm.log")
    ds = XADataSource(app_dsn, tm)
    service.configure(ds=ds)
    resumed = _Resumed()
    invoker_log = logging.getLogger("wsrm_plugin.engine.invoker")
    level = invoker_log.level
    invoker_log.addHandler(resumed)
    invoker_log.setLevel(logging.INFO)
    try:
        server = servers(store_url, policy(retry_cycle_delay), tm=tm)
        answers: list[bytes] = []
        client = clients("memory:", application=lambda envelope, context: answers.append(envelope))
        build = Envelopes(server.url)

        app_pg.stop()  # the database is down from here on
        down_since = time.monotonic()
        for i in range(50):
            for key, items in ONE_WAY.items():
                client.send(server.url, build("record", items[i]), action=action("record"), key=key)
            if i < 10:
                for key, items in REQUESTS.items():
                    client.send(server.url, build("echo", items[i]), action=action("echo"), key=key,
                                expect_reply=True)

        def paused() -> str | None:
            if cli:
                shown = wsrm("status", "--store", store_url)
                assert shown.returncode == 0, shown.stderr
                text = shown.stdout
            else:
                with open_store(store_url, create=False) as store:
                    text = format_report(report(store))
            return text if "DELIVERY PAUSED" in text else None

        shown: list[str] = []
        # the database stays down until the pause shows (a loaded machine may take longer than a
        # 3 s outage to receive the first messages and fail their deliveries): then the rest of it
        assert wait_for(lambda: bool(shown.append(paused() or "") or shown[-1]), timeout=60), \
            "the pause was not shown while the database was down"
        seen = shown[-1]
        assert "delivery                  PAUSED" in seen, seen
        status = server.engine.status()
        assert status.paused and status.poisoned == 0 and status.retrying == 0, status
        # a load balancer's readiness check takes the host out meanwhile (the health check reads
        # the engine's status); its liveness stays: an outage is no reason to restart the service
        ready, body = _get(server.url + "healthz/ready")
        assert ready == 503 and body["checks"]["delivery"]["status"] == "fail", body
        assert _get(server.url + "healthz/live")[0] == 200

        if seconds > 10:  # every message acknowledged although none could be processed
            assert wait_for(lambda: client.status().unacked == 0, timeout=seconds - 5), client.status()
            assert server.engine.status().waiting == len(ITEMS)
        time.sleep(max(0.0, seconds - (time.monotonic() - down_since)))
        status = server.engine.status()
        assert status.poisoned == 0 and status.retrying == 0 and status.delivery_failures == 0, status
        assert service.recorded() == []
        app_pg.start()  # the database is back
        back = time.time()

        assert wait_for(lambda: len(answers) >= 20 and len(_items(app_dsn)) >= len(ITEMS), timeout=180), \
            (len(answers), len(_items(app_dsn)))
        last = _query(app_dsn, "SELECT extract(epoch FROM max(at)) FROM orders")[0][0]
        recovery = float(last) - back
        assert resumed.at, "no RESUMED line"
        resumption = resumed.at[-1] - back  # (negative when a probe got through before start() returned)
        print(f"\n{kind}: {seconds:g} s outage, delivery resumed {resumption:.2f} s and the last of "
              f"{len(ITEMS)} messages delivered {recovery:.2f} s after the database came back "
              f"(target {RECOVERY_TARGET:g} s)")
        items = _items(app_dsn)
        assert Counter(items) == {item: 1 for item in ITEMS}  # every message, exactly once
        for sequence in (*ONE_WAY.values(), *REQUESTS.values()):
            assert [item for item in items if item in set(sequence)] == sequence  # in order
        replies = [parse_envelope(envelope) for envelope in answers]
        assert len(replies) == 20 and not any(reply.is_fault for reply in replies)
        assert wait_for(lambda: server.engine.status().buffered == 0, timeout=60)
        status = server.engine.status()
        assert not status.paused and status.poisoned == 0 and status.retrying == 0
        assert status.delivery_failures == 0
        assert wait_for(lambda: _prepared(app_dsn) == 0, timeout=60)
        # a probe within the cap of the return (jittered below it) and the delivery it tries
        cap = server.engine.policy.max_outage_probe_delay
        assert resumption < RECOVERY_TARGET, f"resumed {resumption:.1f} s after the database's return (cap {cap:g} s)"
        assert recovery < RECOVERY_LIMIT, f"{recovery:.1f} s from the database's return to the last delivery"
        return Outcome(recovery, seen)
    finally:
        invoker_log.removeHandler(resumed)
        invoker_log.setLevel(level)
        service.configure()
        if not app_pg.running:
            app_pg.start()
        ds.close()
        tm.close()


ITEMS = [item for items in (*ONE_WAY.values(), *REQUESTS.values()) for item in items]
