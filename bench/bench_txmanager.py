"""Cost of the transaction manager against raw psycopg2 on the same server, same run.

Two comparisons, each as a ratio (ours / raw), measured in interleaved blocks
so that machine noise hits both sides alike:

* two-database transfer: txmanager (XADataSource, 2PC, recovery log with fsync)
  vs the same statements with raw psycopg2 tpc_begin/tpc_prepare/tpc_commit
  and no log.  Target: <= 1.3.
* one-database transaction: txmanager one-phase commit vs plain BEGIN/COMMIT.
  Target: <= 1.1.

Run: .venv/bin/python bench/bench_txmanager.py [--blocks 10 --per-block 100] [--dsn DSN]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

import psycopg2

from txmanager import TransactionManager
from wsrm_plugin.tools.bank import create_bank
from wsrm_plugin.tools.pgserver import ThrowawayPostgres
from txmanager.postgres import XADataSource

UPDATE = "UPDATE account SET balance = balance + %s WHERE id = %s"


def raw_two_db(conn_a, conn_b, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        gtrid = uuid.uuid4().hex
        xa, xb = conn_a.xid(1, gtrid, "a"), conn_b.xid(1, gtrid, "b")
        conn_a.tpc_begin(xa)
        conn_b.tpc_begin(xb)
        with conn_a.cursor() as c:
            c.execute(UPDATE, (-1, i % 10))
        with conn_b.cursor() as c:
            c.execute(UPDATE, (1, i % 10))
        conn_a.tpc_prepare()
        conn_b.tpc_prepare()
        conn_a.tpc_commit()
        conn_b.tpc_commit()
    return time.perf_counter() - t0


def tm_two_db(tm, ds_a, ds_b, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        with tm.transaction():
            with ds_a.connection() as a, a.cursor() as c:
                c.execute(UPDATE, (-1, i % 10))
            with ds_b.connection() as b, b.cursor() as c:
                c.execute(UPDATE, (1, i % 10))
    return time.perf_counter() - t0


def raw_one_db(conn, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        with conn.cursor() as c:
            c.execute(UPDATE, (1, i % 10))
        conn.commit()
    return time.perf_counter() - t0


def tm_one_db(tm, ds, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        with tm.transaction():
            with ds.connection() as a, a.cursor() as c:
                c.execute(UPDATE, (1, i % 10))
    return time.perf_counter() - t0


def measure(dsn_a: str, dsn_b: str, blocks: int, per_block: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in ("raw2", "tm2", "raw1", "tm1")}
    with tempfile.TemporaryDirectory() as tmp:
        tm = TransactionManager(node="bench", log=f"{tmp}/tx.log")
        ds_a, ds_b = XADataSource(dsn_a, tm), XADataSource(dsn_b, tm)
        conn_a, conn_b = psycopg2.connect(dsn_a), psycopg2.connect(dsn_b)
        try:
            # warm-up: connections, plans, pools
            raw_two_db(conn_a, conn_b, 20), tm_two_db(tm, ds_a, ds_b, 20)
            raw_one_db(conn_a, 20), tm_one_db(tm, ds_a, 20)
            for _ in range(blocks):
                times["raw2"].append(raw_two_db(conn_a, conn_b, per_block))
                times["tm2"].append(tm_two_db(tm, ds_a, ds_b, per_block))
                times["raw1"].append(raw_one_db(conn_a, per_block))
                times["tm1"].append(tm_one_db(tm, ds_a, per_block))
        finally:
            conn_a.close(), conn_b.close()
            tm.close()
    return times


def report(times: dict[str, list[float]], per_block: int) -> str:
    def ms(key: str) -> float:
        return statistics.median(times[key]) / per_block * 1000

    r2 = statistics.median(t / r for t, r in zip(times["tm2"], times["raw2"]))
    r1 = statistics.median(t / r for t, r in zip(times["tm1"], times["raw1"]))
    return "\n".join([
        f"two-database transfer: txmanager {ms('tm2'):.3f} ms, raw tpc {ms('raw2'):.3f} ms, "
        f"ratio {r2:.2f} (target <= 1.3)",
        f"one-database tx:       txmanager {ms('tm1'):.3f} ms, plain {ms('raw1'):.3f} ms, "
        f"ratio {r1:.2f} (target <= 1.1)",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--per-block", type=int, default=100)
    args = p.parse_args()
    with ThrowawayPostgres() as pg:
        for name in ("bench_a", "bench_b"):
            pg.create_database(name)
            create_bank(pg.dsn(name), 10, 1_000_000)
        times = measure(pg.dsn("bench_a"), pg.dsn("bench_b"), args.blocks, args.per_block)
    print(report(times, args.per_block))


if __name__ == "__main__":
    main()
