"""An XA request-reply service killed (SIGKILL) again and again: every call answered once, its row once.

Real parts: a reliable spyne service in its own process whose PostgreSQL store lives in its
application's database (XA in one database: the method's INSERT and the store's work in one
branch, committed in one phase), a reliable zeep client in this process calling ``echo`` one
call after another over loopback HTTP, each answered in its HTTP response.  From a sequence's
third call on, the service runs the method before the request's receipt and sends the receipt
with the COMMIT (``Destination._receipt_at_commit``): the path a kill here must not break.
Whatever the instant of a kill, each call gets its answer, and the ``orders`` table holds each
item once, in the order called.
"""

from __future__ import annotations

import json
import random
import threading

import pytest
import zeep

from interceptors.zeep_client.client import reliable_client
from tests.engine.support import wait_for

from .conftest import fast_policy
from .test_processes import _free_port, _rows, orders_db, processes  # noqa: F401 -- fixtures

pytestmark = pytest.mark.postgres

CALLS = 60
KILLS = 5


@pytest.mark.slow
def test_an_xa_request_reply_service_killed_at_random_answers_each_call_once(
        processes, orders_db, tmp_path):  # noqa: F811
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    counters = tmp_path / "counters.json"
    options = dict(store="postgresql:" + orders_db, port=_free_port(), dsn=orders_db, node="spyne-rr",
                   tm_log=tmp_path / "tm.log", delay=0.01, quick_application=60.0, counters=counters)
    server = processes(**options)
    client = reliable_client(zeep.Client(server.url + "?wsdl"), "memory:", fast_policy())
    items = [f"item-{i:03d}" for i in range(CALLS)]
    answers: list[str] = []
    failed: list[BaseException] = []

    def call_each() -> None:
        try:
            for item in items:
                answers.append(client.service.echo(item).result(timeout=120))
        except BaseException as exc:  # noqa: BLE001 -- reported by the test below
            failed.append(exc)

    caller = threading.Thread(target=call_each, name="caller", daemon=True)
    caller.start()
    try:
        for kill in range(KILLS):
            # a kill once a few more calls went the guessed way (3 to 8 rows after the last)
            target = min(len(_rows(orders_db)) + rng.randint(3, 8), CALLS - 10)
            assert wait_for(lambda: len(_rows(orders_db)) >= target or not caller.is_alive(), timeout=120), \
                f"seed {seed}: {len(_rows(orders_db))} rows before kill {kill}"
            assert caller.is_alive(), f"seed {seed}: the calls ended before kill {kill}: {failed}"
            server.kill()
            server = processes(**options)  # same store, port, node and log: recovery, then the rest
        caller.join(timeout=300)
        assert not caller.is_alive(), f"seed {seed}: {len(answers)} of {CALLS} calls answered"
        assert not failed, f"seed {seed}: {failed}"
        assert answers == [f"re:{item}" for item in items], f"seed {seed}"
        assert [item for item, _ in _rows(orders_db)] == items, f"seed {seed}"  # each once, in order
        assert wait_for(lambda: client.engine.status().unacked == 0, timeout=60)
    finally:
        client.stop(timeout=5)
    server.stop()
    # the last process, after its restart, took the path under test
    assert json.loads(counters.read_text())["receipts_at_commit"] > 0, counters.read_text()
