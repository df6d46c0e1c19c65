"""Several hosts on one PostgreSQL store: messages per second with 1, 2 and 3 hosts, and takeover time.

    .venv/bin/python bench/bench_multihost.py                 # as root: the hosts are network namespaces
    .venv/bin/python bench/bench_multihost.py --messages 800 --runs 5

Each host is ``tests.multihost.host_app`` in a network namespace of its own
(the cluster of ``tests/multihost``), behind haproxy (round robin, then
hashing on the ``WSRM-Sequence`` header: ``--balance``); each
delivery is one XA transaction (the store's branch with the commit mark, the
orders row prepared in another database).  Four clients send ``--messages``
one-way messages in all; the rate is delivered-and-committed rows per second
from the first to the last row, with the CPU time per message of the hosts,
of PostgreSQL and of the clients (this process), and the store database's
commits and rollbacks per message (pg_stat_database).  Then, ``--runs`` times, one host is
SIGKILLed while it holds a prepared branch (caught when it can be) and the
time until its claim and prepared branches are gone is taken, as is the time
until a host cut off from the network is taken over (the keepalive bound of
``host_takeover_within``).  Medians are printed.

On a 2-core machine the hosts, haproxy, PostgreSQL and the clients share two
cores: more hosts add processes, not CPU, so the rate cannot grow with the
hosts here; the figures say what the coordination costs, not how it scales.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.multihost.clients import Clients  # noqa: E402 -- after the path is set
from tests.multihost.cluster import Cluster, namespaces_allowed, wait_for  # noqa: E402


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of ``pid`` (with its reaped children's, when asked); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / _TICK


def _cpu_split(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of the hosts, PostgreSQL (the postmaster's reaped backends included), this process."""
    assert cluster.pg is not None and cluster.pg.pid is not None
    postmaster = cluster.pg.pid
    pg = _cpu(postmaster, children=True) + sum(_cpu(p) for p in cluster.pg.pids() if p != postmaster)
    own = os.times()
    (commits, rollbacks), = cluster.query(cluster.store_dsn, "SELECT xact_commit, xact_rollback FROM pg_stat_database "
                                          "WHERE datname = current_database()")
    return {"hosts": sum(_cpu(h.pid) for h in cluster.hosts if h.alive), "postgres": pg,
            "clients": own.user + own.system, "store commits": commits / 1000, "store rollbacks": rollbacks / 1000}


def rate(hosts: int, messages: int, workdir: Path, balance: str = "roundrobin") -> tuple[float, dict[str, float]]:
    """Messages per second, and CPU milliseconds per message by who spent them."""
    cluster = Cluster(workdir, hosts, balance=balance).start()
    cluster.env["POLL_INTERVAL"] = "0.2"  # the policy's default, not the tests' impatient one
    try:
        cluster.start_hosts()
        clients = Clients(cluster, 4)
        try:
            clients.send(25)  # warm up: connections, prepared statements, the WSDL
            assert wait_for(lambda: len(cluster.orders()) >= clients.expected(), 300)
            base = clients.expected()
            idle_before, idle_started = _cpu_split(cluster), time.monotonic()
            time.sleep(5)  # what the hosts spend doing nothing (polls, the watcher, health checks)
            idle_after, idle_took = _cpu_split(cluster), time.monotonic() - idle_started
            idle = {f"idle {k} ms/s": 1000 * (idle_after[k] - idle_before[k]) / idle_took
                    for k in ("hosts", "postgres")}
            cpu_before = _cpu_split(cluster)
            started = time.monotonic()
            clients.send(messages // 4)
            target = clients.expected()
            assert wait_for(lambda: len(cluster.orders()) >= target, 1200, interval=0.05), "not all delivered"
            took = time.monotonic() - started
            cpu_after = _cpu_split(cluster)
            count = target - base
            return count / took, {**{k: 1000 * (cpu_after[k] - cpu_before[k]) / count for k in cpu_after}, **idle}
        finally:
            clients.stop()
    finally:
        cluster.close()


def takeovers(runs: int, workdir: Path, partition: bool = True) -> tuple[list[float], list[float]]:
    killed, cut = [], []
    cluster = Cluster(workdir, 3).start()
    try:
        cluster.start_hosts()
        clients = Clients(cluster, 4)
        try:
            for _ in range(runs):
                clients.send(100)
                victim = next(h for h in cluster.hosts if h.alive)
                wait_for(lambda v=victim: bool(cluster.prepared(v.node)), 10, interval=0.002)
                at = victim.kill()
                assert wait_for(lambda v=victim: cluster.released(v.node), 120, interval=0.02)
                killed.append(time.monotonic() - at)
                victim.start()
            for _ in range(runs if partition else 0):
                victim = next(h for h in cluster.hosts if h.alive)
                cluster.cut(victim)
                at = time.monotonic()
                assert wait_for(lambda v=victim: cluster.released(v.node), 120, interval=0.02)
                cut.append(time.monotonic() - at)
                cluster.mend(victim)
                victim.stop()  # it lost its node: restart it, as its health check asks
                victim.start()
            assert wait_for(lambda: len(cluster.orders()) >= clients.expected(), 600)
        finally:
            clients.stop()
    finally:
        cluster.close()
    return killed, cut


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000, help="messages per rate run (default 2000)")
    parser.add_argument("--runs", type=int, default=5, help="rate runs per host count and takeovers (default 5)")
    parser.add_argument("--hosts", default="1,2,3", help="host counts to measure (default 1,2,3)")
    parser.add_argument("--balance", default="roundrobin,hdr(WSRM-Sequence)",
                        help="haproxy balance algorithms to compare, comma-separated (default: round robin, "
                             "and hashing on the WSRM-Sequence header)")
    args = parser.parse_args()
    why = namespaces_allowed()
    if why:
        print(f"bench_multihost: no network namespaces ({why}): hosts on loopback addresses, no partition",
              flush=True)
    print(f"machine: {os.cpu_count()} cores; {args.messages} XA one-way messages from 4 clients, "
          f"median of {args.runs} runs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        for hosts, balance in [(int(h), b) for b in args.balance.split(",") for h in args.hosts.split(",")]:
            if hosts == 1 and balance != "roundrobin":
                continue  # one host: nothing to balance
            runs = [rate(hosts, args.messages, Path(tmp) / f"rate-{hosts}-{i}", balance) for i in range(args.runs)]
            rates = [r for r, _ in runs]
            cpu = {k: statistics.median(c[k] for _, c in runs) for k in runs[0][1]}
            print(f"{hosts} host(s), {balance}: {statistics.median(rates):7.1f} messages/s "
                  f"(runs: {', '.join(f'{r:.1f}' for r in rates)}); CPU ms per message: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if not k.startswith(("idle", "store")))
                  + "; store transactions per message: "
                  + ", ".join(f"{k[6:]} {v:.2f}" for k, v in cpu.items() if k.startswith("store"))
                  + "; idle CPU ms per second: "
                  + ", ".join(f"{k[5:-5]} {v:.1f}" for k, v in cpu.items() if k.startswith("idle")), flush=True)
        killed, cut = takeovers(args.runs, Path(tmp) / "takeover", partition=why is None)
    print(f"host SIGKILLed -> its claim and prepared branches released: median {statistics.median(killed):.2f}s "
          f"(runs: {', '.join(f'{t:.2f}' for t in killed)})")
    if cut:
        print(f"host cut off   -> taken over and released (bound 10 s):    median {statistics.median(cut):.2f}s "
              f"(runs: {', '.join(f'{t:.2f}' for t in cut)})")


if __name__ == "__main__":
    main()
