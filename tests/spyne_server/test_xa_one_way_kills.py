"""An XA one-way service killed (SIGKILL) again and again: every item's row once, in order.

Real parts: a reliable spyne service in its own process whose PostgreSQL store lives in its
application's database (XA in one database: the method's INSERT and the store's work in one
branch, committed in one phase), a reliable zeep client in this process sending ``record``
(one-way) for each item over loopback HTTP.  From a sequence's third message on, the service
runs the method before the message's receipt and sends the receipt and take with the COMMIT
(``Destination._one_way_at_commit``): the path a kill here must not break.  Whatever the instant
of a kill, the ``orders`` table holds each item once, in the order sent.

The last items are sent only after the last restart, once everything before them is stored and
acknowledged: the last process then receives them in order, one after the other, and must take
that path (its ``receipts_at_commit`` counter, written at its clean stop, above 0).  Sent before
the kills, every row could be in before the last restart on a loaded machine, and the last
process's counter said nothing.
"""

from __future__ import annotations

import json
import random

import pytest
import zeep

from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for

from .conftest import fast_policy
from .test_processes import _free_port, _rows, orders_db, processes  # noqa: F401 -- fixtures

pytestmark = pytest.mark.postgres

ITEMS = 60
#: sent after the last restart
LAST = 10
KILLS = 5


@pytest.mark.slow(minutes=0.75)
def test_an_xa_one_way_service_killed_at_random_keeps_each_item_once_in_order(
        processes, orders_db, tmp_path):  # noqa: F811
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    counters = tmp_path / "counters.json"
    options = dict(store="postgresql:" + orders_db, port=_free_port(), dsn=orders_db, node="spyne-ow",
                   tm_log=tmp_path / "tm.log", delay=0.01, quick_application=60.0, counters=counters)
    server = processes(**options)
    client = reliable_client(zeep.Client(server.url + "?wsdl"), "memory:", fast_policy())
    items = [f"item-{i:03d}" for i in range(ITEMS)]
    first = ITEMS - LAST
    try:
        for item in items[:first]:
            client.service.record(item)
        for kill in range(KILLS):
            # a kill once a few more items went the guessed way (3 to 8 rows after the last)
            target = min(len(_rows(orders_db)) + rng.randint(3, 8), first - 5)
            assert wait_for(lambda: len(_rows(orders_db)) >= target, timeout=120), \
                f"seed {seed}: {len(_rows(orders_db))} rows before kill {kill}"
            server.kill()
            server = processes(**options)  # same store, port, node and log: recovery, then the rest
        # everything sent so far stored and acknowledged: the last items arrive in order, to
        # the last process alone
        assert wait_for(lambda: len(_rows(orders_db)) >= first, timeout=180), \
            f"seed {seed}: {len(_rows(orders_db))} of {first} rows"
        assert wait_for(lambda: client.engine.status().unacked == 0, timeout=60), f"seed {seed}"
        for item in items[first:]:
            client.service.record(item)
        assert wait_for(lambda: len(_rows(orders_db)) >= ITEMS, timeout=180), \
            f"seed {seed}: {len(_rows(orders_db))} of {ITEMS} rows"
        assert wait_for(lambda: client.engine.status().unacked == 0, timeout=60), f"seed {seed}"
        assert [item for item, _ in _rows(orders_db)] == items, f"seed {seed}"  # each once, in order
    finally:
        client.stop(timeout=5)
    server.stop()
    # the last process took the path under test (its counters are written at its clean stop)
    assert json.loads(counters.read_text())["receipts_at_commit"] > 0, f"seed {seed}: {counters.read_text()}"
