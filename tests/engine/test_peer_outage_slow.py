"""A peer down for ten minutes, the sender on its default policy (about 11-12 minutes).

The peer is a reliable engine in its own process (``tests.engine.peer``, SQLite store, a delivery
log), killed with SIGKILL and started again on the same port ten minutes later.  Between the
sender and the peer a proxy (``LossyProxy``, losing nothing) counts every request the sender
makes; while the peer is down it answers 502, as a gateway in front of a dead service does.
Four sequences have messages delivered before the outage, queued at its start and queued in its
middle.  Every message must arrive once, in order per sequence; the first after the peer's
return within the retransmission cap (60 s) of it; no sequence faulted (``max_retries`` is left
at None); and the requests during the outage one probe per back-off interval, not one per
sequence or message.  The figures are printed.
"""

from __future__ import annotations

import logging
import sqlite3
import time

import pytest

from wsrm_plugin.engine import ReliableEngine, RMPolicy
from wsrm_plugin.engine.transport import free_port
from wsrm_plugin.tools.proxy import LossyProxy

from .peer import PeerProcess
from .support import ACTION, payload, wait_for

pytestmark = [pytest.mark.slow(minutes=11), pytest.mark.timeout(1500)]

OUTAGE = 600.0
KEYS = 4
PER_BATCH = 5


def _delivered(path: str) -> list[tuple[str, float]]:
    """(item, epoch seconds) of each hand-over the peer logged, duplicates included."""
    try:
        with sqlite3.connect(path, timeout=10) as conn:
            return [(item, at) for item, at in conn.execute("SELECT item, at FROM delivered ORDER BY id")]
    except sqlite3.OperationalError:  # not created yet
        return []


def test_a_peer_down_for_ten_minutes_gets_probes_and_everything_once_it_is_back(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="wsrm_plugin")
    log_path = str(tmp_path / "delivered.db")
    port = free_port()
    peer = PeerProcess("--role", "server", "--store", f"sqlite:///{tmp_path}/peer.db", "--port", str(port),
                       "--log", log_path)
    proxy = LossyProxy(peer.ready_url()).start()
    policy = RMPolicy()  # the defaults: base 3 s doubling to 60 s, max_retries None, probes capped at 60 s
    client = ReliableEngine(f"sqlite:///{tmp_path}/client.db", policy, name="client").start()
    batches: list[list[str]] = []

    def send_batch() -> None:
        b = len(batches)
        batch = [f"k{k}-{b}-{i}" for k in range(KEYS) for i in range(PER_BATCH)]
        for item in batch:
            client.send(proxy.url, payload(item), action=ACTION, key=item.split("-")[0])
        batches.append(batch)

    try:
        send_batch()  # before the outage: delivered
        assert wait_for(lambda: len(_delivered(log_path)) == KEYS * PER_BATCH and client.status().unacked == 0,
                        timeout=120)

        peer.kill()
        down = time.monotonic()
        before = proxy.stats.received
        send_batch()  # queued as the peer goes down
        assert wait_for(lambda: client.status().unreachable_peers != (), timeout=120)
        tripped = time.monotonic() - down
        at_trip = proxy.stats.received - before
        [seen] = client.status().unreachable_peers
        assert seen.address == proxy.url and "HTTP 502" in seen.last_error

        time.sleep(max(0.0, down + OUTAGE / 2 - time.monotonic()))
        send_batch()  # queued in the middle of the outage
        mid = client.status()
        assert mid.faulted_sequences == 0 and mid.unreachable_peers[0].held > 0
        time.sleep(max(0.0, down + OUTAGE - time.monotonic()))

        during = proxy.stats.received - before
        probes = client.status().probes_sent
        peer.start()
        peer.ready_url(timeout=120)
        back = time.time()
        outage = time.monotonic() - down

        expected = [item for batch in batches for item in batch]
        assert wait_for(lambda: len(_delivered(log_path)) >= len(expected), timeout=300), _delivered(log_path)
        rows = _delivered(log_path)
        # the first delivery after the outage (the first batch's were all logged before it); a
        # probe that gets in between the peer's READY and this process reading it is before back
        first = min(at for _, at in rows[KEYS * PER_BATCH:])
        last = max(at for _, at in rows)
        print(f"\npeer down {outage:.0f}s: judged unreachable after {tripped:.1f}s ({at_trip} requests until "
              f"then); {during} requests to it during the outage, {probes} of them probes; peer back -> first "
              f"message delivered {first - back:.1f}s, all {len(expected)} delivered {last - back:.1f}s")
        assert first - back <= policy.max_retransmission_interval + 10  # within the cap (+ a loaded machine)
        items = [item for item, _ in rows]
        assert sorted(items) == sorted(expected)  # every message once
        for k in range(KEYS):
            assert [i for i in items if i.startswith(f"k{k}-")] == [i for i in expected if i.startswith(f"k{k}-")]
        # one probe per back-off interval: at most ~25 over ten minutes (3, 6, 12, 24, 48, then 60 s,
        # each jittered to 50-100%), plus the queued messages' tries before the peer was judged down;
        # each of the 40 messages on its own timer would have been ~10 requests each
        assert probes <= 30, probes
        assert during - at_trip <= probes + 2, (during, at_trip, probes)
        assert wait_for(lambda: client.status().unacked == 0, timeout=120)
        final = client.status()
        assert final.faulted_sequences == 0 and final.unreachable_peers == () and final.peer_outages == 1
        records = [r.getMessage() for r in caplog.records if r.name == "wsrm_plugin.engine.reachability"
                   and r.levelno >= logging.INFO]
        assert len(records) == 2 and "unreachable" in records[0] and "reachable again" in records[1], records
    finally:
        client.stop(timeout=10)
        proxy.stop()
        peer.stop()
