"""Spark: the transactional reliable sink vs plain zeep calls from foreachPartition.

Both jobs write the same rows (default 100,000 in 8 partitions) to the
client's table and send one SOAP ``record`` per row to the same spyne
service, which inserts each into its own database:

* ``reliable``: ``df.write.format("wsrm")`` (rows + enqueue under XA branches,
  prepare, driver commit), then the sender delivers with WS-RM and the
  service records each message inside an XA delivery transaction;
* ``plain``: ``foreachPartition`` inserting the rows (autocommit batches) and
  calling the service with zeep, one blocking request per row -- no
  transaction, no retry, nothing survives a crash.

Reported: rows/s of the Spark job, delivered messages/s (job start until the
service recorded every message), and reliable/plain ratios::

    python bench/bench_spark.py --rows 100000 --partitions 8
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

import psycopg2  # noqa: E402

from interceptors.spyne_server.service import reliable_service  # noqa: E402
from tests.spyne_server import service  # noqa: E402
from txmanager import TransactionManager  # noqa: E402
from wsrm_plugin.tools.pgserver import ThrowawayPostgres  # noqa: E402
from txmanager.postgres import XADataSource  # noqa: E402
from wsrm_plugin.engine import RMPolicy  # noqa: E402
from wsrm_plugin.spark import register  # noqa: E402
from wsrm_plugin.store import open_store  # noqa: E402

#: Threads of the service's HTTP server (waitress).
_HTTP_THREADS = 8


def _sql(dsn: str, statement: str) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def _wait_count(dsn: str, table: str, count: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _sql(dsn, f"SELECT count(*) FROM {table}")[0][0] >= count:
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"{table} did not reach {count} rows in {timeout}s")


def _progress(server, server_db: str, every: float, started: float) -> threading.Event:
    """Print, every ``every`` seconds, what the service recorded and what waits in its invoker buffer.

    A growing buffer means delivery (the invoker's XA transactions) is the
    bottleneck; an empty one means the messages arrive no faster (sender side).
    """
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            status = server.engine.status()
            recorded = _sql(server_db, "SELECT count(*) FROM orders")[0][0]
            print(f"  {time.monotonic() - started:6.1f}s recorded {recorded} buffered {status.buffered} "
                  f"delivered {status.delivered}", flush=True)

    threading.Thread(target=run, name="bench-progress", daemon=True).start()
    return stop


def _print_statements(dsn: str, top: int, messages: int) -> None:
    """The job's costliest statements (server execution time), and how often each ran per message."""
    rows = _sql(dsn, "SELECT calls, total_exec_time, left(regexp_replace(query, '\\s+', ' ', 'g'), 150) "
                     "FROM pg_stat_statements ORDER BY total_exec_time DESC")
    total_ms = sum(r[1] for r in rows)
    print(f"  SQL: {sum(r[0] for r in rows) / messages:.1f} statements and {total_ms / messages:.3f} ms "
          "of execution per message; the costliest:")
    for calls, ms, query in rows[:top]:
        print(f"  {calls / messages:7.2f}/msg {ms / messages * 1000:8.1f} us/msg  {query}")


def plain_partition(url: str, dsn: str):
    """foreachPartition body: insert the rows, then one plain zeep call per row."""

    def run(rows):
        import zeep
        from psycopg2.extras import execute_values

        batch = [row.item for row in rows]
        conn = psycopg2.connect(dsn)
        try:
            with conn, conn.cursor() as cur:
                execute_values(cur, "INSERT INTO sent (item) VALUES %s", [(i,) for i in batch],
                               page_size=1000)
        finally:
            conn.close()
        client = zeep.Client(url + "?wsdl")
        for item in batch:
            client.service.record(item)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--senders", type=int, default=2, help="`wsrm send` processes sharing the store")
    parser.add_argument("--send-concurrency", type=int, default=8, help="requests in flight per sender")
    parser.add_argument("--modes", default="plain,reliable", help="which jobs to run, comma separated")
    parser.add_argument("--shared-buffers", default="256MB", help="the PostgreSQL server's shared_buffers")
    parser.add_argument("--progress", type=float, default=0.0,
                        help="every this many seconds, print the reliable server's backlog (0: never)")
    parser.add_argument("--statements", type=int, default=0,
                        help="print each job's N costliest SQL statements (pg_stat_statements), per message")
    parser.add_argument("--delivery-batch", type=int, default=50,
                        help="messages the reliable server delivers per XA transaction (1: one each)")
    parser.add_argument("--delivery-batch-seconds", type=float, default=0.5,
                        help="a delivery batch stops taking messages after this long")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "task queue depth": expected here
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    results: dict[str, dict[str, float]] = {}
    # 256MB of shared buffers (PostgreSQL's own default is 128MB): the test server's 32MB is too
    # small for a store holding 100,000 messages and their indexes, and both jobs share the server
    settings = {"shared_buffers": args.shared_buffers}
    if args.statements:
        settings["shared_preload_libraries"] = "pg_stat_statements"
    with ThrowawayPostgres(settings=settings) as pg:
        if args.statements:
            _sql(pg.dsn(), "CREATE EXTENSION pg_stat_statements")
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(f"local[{args.cores}]").appName("bench-spark")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        df = spark.range(args.rows, numPartitions=args.partitions).selectExpr(
            "format_string('order-%07d', id) AS item").cache()
        df.count()
        # The service runs in this process, next to the driver's objects. spyne calls gc.collect()
        # after a request at most once a second, and a full collection walks every object the
        # process holds, the GIL held throughout (seen: ~12% of the server's wall time). Freezing
        # what exists now, as a server does after start-up, spares both jobs that walk alike.
        gc.freeze()
        for mode in args.modes.split(","):
            client_db, server_db = pg.create_database(f"cli_{mode}"), pg.create_database(f"srv_{mode}")
            rms = pg.create_database(f"rms_{mode}")
            _sql(client_db, "CREATE TABLE sent (item text NOT NULL)")
            _sql(server_db, service.SCHEMA)
            tm = TransactionManager(node=f"bench-{mode}", log=work / f"{mode}-tm.log")
            ds = XADataSource(server_db, tm, pool_size=8)
            service.configure(ds=ds)
            # inactivity_timeout=None: with a backlog of ~100k messages the sender reaches the
            # last partition's sequence more than the default 600 s after its CreateSequence, and
            # the destination would end it as inactive (seen: 12,500 messages dropped).
            # delivery_batch: one two-phase commit (two prepared branches, a log fsync) per batch of
            # a sequence's messages instead of per message; it is the destination's throughput.
            # delivery_batch_seconds: with 4 invoker threads sharing the GIL with the HTTP threads,
            # the default 0.05 s ended the average batch after ~7 messages.
            policy = RMPolicy(soap_version="1.1", base_retransmission_interval=2.0, send_batch=200,
                              invoker_threads=4, inactivity_timeout=None,
                              delivery_batch=args.delivery_batch,
                              delivery_batch_seconds=args.delivery_batch_seconds)
            # The store's connection pool sized for the threads that use it at once (8 HTTP
            # threads receiving, the invoker threads, the workers): with the default of 4 idle
            # sessions most transactions opened a new PostgreSQL connection (a backend fork each).
            server_store = open_store("postgresql:" + (rms if mode == "plain" else server_db),
                                      pool_size=_HTTP_THREADS + policy.invoker_threads + 4)
            server = reliable_service(service.application(), server_store, policy, tm=tm, required=False)
            server.serve(threads=_HTTP_THREADS)
            server.start()
            if args.statements:
                _sql(pg.dsn(), "SELECT pg_stat_statements_reset()")
            started = time.monotonic()
            if mode == "plain":
                df.foreachPartition(plain_partition(server.url, client_db))
                job_done = time.monotonic()
                delivered = _wait_count(server_db, "orders", args.rows, 600)
            else:
                # `wsrm send` processes run while the job runs, as deployed: the sender is its own
                # process (like plain mode's zeep clients, which run in the executors), and
                # several share the store (SKIP LOCKED pollers)
                senders = [subprocess.Popen(
                    [sys.executable, "-m", "wsrm_plugin.cli", "send", "--store", "postgresql:" + rms,
                     "--retransmission-interval", str(policy.base_retransmission_interval),
                     "--send-batch", str(policy.send_batch),
                     "--send-concurrency", str(args.send_concurrency), "--report-every", "3600"],
                    stdout=subprocess.DEVNULL, stderr=open(work / f"sender-{i}.log", "wb"))
                    for i in range(args.senders)]
                stop_progress = _progress(server, server_db, args.progress, started) if args.progress else None
                (df.write.format("wsrm").mode("append")
                   .option("target", server.url).option("operation", "record").option("fields", "item")
                   .option("store", "postgresql:" + rms).option("log", str(work / "driver-tm.log"))
                   .option("database", client_db).option("table", "sent").option("batchSize", "1000")
                   .save())
                job_done = time.monotonic()
                delivered = _wait_count(server_db, "orders", args.rows, 1800)
                for sender in senders:
                    sender.send_signal(signal.SIGINT)
                for sender in senders:
                    sender.wait(30)
                if stop_progress is not None:
                    stop_progress.set()
            server.stop()
            server_store.close()
            ds.close()
            tm.close()
            sent = _sql(client_db, "SELECT count(*) FROM sent")[0][0]
            recorded = _sql(server_db, "SELECT count(*), count(DISTINCT item) FROM orders")[0]
            results[mode] = {"job_seconds": job_done - started, "rows_per_s": args.rows / (job_done - started),
                             "delivered_per_s": args.rows / (delivered - started),
                             "rows": sent, "recorded": recorded[0], "distinct_recorded": recorded[1]}
            print(mode, json.dumps({k: round(v, 1) for k, v in results[mode].items()}), flush=True)
            if args.statements:
                _print_statements(pg.dsn(), args.statements, args.rows)
        spark.stop()
    if len(results) < 2:
        return 0
    ratio_rows = results["reliable"]["rows_per_s"] / results["plain"]["rows_per_s"]
    ratio_delivered = results["reliable"]["delivered_per_s"] / results["plain"]["delivered_per_s"]
    print(f"ratio reliable/plain: job rows/s {ratio_rows:.2f}, delivered messages/s {ratio_delivered:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
