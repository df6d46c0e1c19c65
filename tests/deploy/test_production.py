"""The production deployment of docs/deploy.md, under load and loss, with a worker killed (issue 13.4).

gunicorn with 3 workers and a waitress process with 8 threads serve one
service on one PostgreSQL store; 4 clients send 2,000 one-way messages
through lossy proxies (drops, lost responses, duplicates, reordering); one
gunicorn worker is killed (SIGKILL) mid-run and gunicorn respawns it.  Every
message runs its transaction exactly once and each client's messages are
recorded in the order sent.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.tools.proxy import LossyProxy

from tests.spyne_server.conftest import Envelopes, action, fast_policy

from .support import Deployment, create_orders, free_port, marks, pid_alive, prepared, rows, wait_for
from .test_gunicorn import _answers

pytestmark = [pytest.mark.slow(minutes=0.75), pytest.mark.postgres, pytest.mark.timeout(1800)]

CLIENTS = 4
PER_CLIENT = 500


def test_gunicorn_and_waitress_on_one_store_2000_messages_through_loss_with_a_worker_killed(
        pg_dsn_factory, tmp_path: Path) -> None:
    orders = pg_dsn_factory("prod_orders")
    create_orders(orders)
    store = f"postgresql:{pg_dsn_factory('prod_store')}"
    slot_dir, mark_dir = tmp_path / "slots", tmp_path / "marks"
    slot_dir.mkdir()
    mark_dir.mkdir()
    env = {"WSRM_STORE": store, "ORDERS_DSN": orders, "SLOT_DIR": str(slot_dir), "MARK_DIR": str(mark_dir),
           "SLOT_PREFIX": "orders"}
    g_port, w_port = free_port(), free_port()
    servers = [Deployment.gunicorn(g_port, 3, env, tmp_path / "gunicorn.log"),
               Deployment.waitress(w_port, env, tmp_path / "waitress.log")]
    gunicorn, waitress = servers
    proxies: list[LossyProxy] = []
    clients: list[ReliableEngine] = []
    try:
        assert wait_for(lambda: len(marks(mark_dir, "started")) == 4, timeout=180), \
            gunicorn.output() + waitress.output()
        assert wait_for(lambda: _answers(f"http://127.0.0.1:{g_port}/")
                        and _answers(f"http://127.0.0.1:{w_port}/"), timeout=60)
        for seed, port in ((21, g_port), (22, w_port)):
            proxies.append(LossyProxy(f"http://127.0.0.1:{port}/", drop=0.05, drop_response=0.05,
                                      duplicate=0.05, reorder=0.05, seed=seed).start())
        build = Envelopes(f"http://127.0.0.1:{g_port}/")
        sent: dict[str, list[str]] = {}
        for k in range(CLIENTS):
            client = ReliableEngine("memory:", fast_policy(), name=f"client-{k}")
            clients.append(client)
            client.serve()
            client.start()
            sent[f"c{k}"] = [f"c{k}-{i:04d}" for i in range(PER_CLIENT)]
        for i in range(PER_CLIENT):
            for k, client in enumerate(clients):
                proxy = proxies[k % 2]  # clients 0 and 2 to gunicorn, 1 and 3 to waitress
                client.send(proxy.url, build("record", sent[f"c{k}"][i]), action=action("record"))
        total = CLIENTS * PER_CLIENT

        # kill a gunicorn worker once a quarter of the messages went through
        assert wait_for(lambda: len(rows(orders)) >= total // 4, timeout=600), len(rows(orders))
        workers = [m for m in marks(mark_dir, "started") if m["pid"] != waitress.process.pid
                   and pid_alive(m["pid"])]
        victim = workers[0]
        os.kill(victim["pid"], signal.SIGKILL)
        done_at_kill = len(rows(orders))
        assert done_at_kill < total, "the kill came too late to test anything"
        assert wait_for(lambda: len(marks(mark_dir, "started")) == 5, timeout=120), gunicorn.output()

        assert wait_for(lambda: len(rows(orders)) >= total, timeout=1200), (len(rows(orders)), gunicorn.output())
        for client in clients:
            assert wait_for(lambda: client.status().unacked == 0, timeout=300), client.status()
        got = rows(orders)
        items = [item for item, _ in got]
        counts = Counter(items)
        assert len(items) == total and set(counts.values()) == {1}, [i for i, n in counts.items() if n > 1]
        for name, expected in sent.items():
            assert [item for item in items if item.startswith(name + "-")] == expected, name
        # all four processes and the respawned worker did work; nothing is left in doubt
        assert len({node for _, node in got}) >= 3
        assert wait_for(lambda: prepared(orders) == [], timeout=60)
        respawned = [m for m in marks(mark_dir, "started") if m["node"] == victim["node"]
                     and m["pid"] != victim["pid"]]
        assert respawned, marks(mark_dir, "started")
        assert len(list(slot_dir.glob("*.log"))) == 4  # one per process, the respawned one re-took its slot
        stats = [p.stats for p in proxies]
        assert all(s.dropped and s.responses_dropped and s.duplicated for s in stats), stats
    finally:
        for client in clients:
            client.stop(timeout=5)
        for proxy in proxies:
            proxy.stop(flush=False)
        for server in servers:
            server.stop()
