"""Spark orders pipeline: every order written to the shop's table AND sent reliably, exactly once.

What runs (all on this machine, PostgreSQL from ``--dsn`` or a throwaway server):

* a spyne ``OrderService`` behind WS-RM (``reliable_service``) that records
  each order in ITS OWN database, in the same XA transaction that takes the
  message out of its WS-RM store;
* a Spark job (local mode) that generates orders and writes them with
  ``df.write.format("wsrm")``: each task inserts its orders into the shop's
  ``orders_sent`` table and enqueues one SOAP ``record`` request per order in
  the shared message store, under its own XA branches, and prepares; the
  driver commits exactly the attempts Spark accepted.  One task is made to
  fail half-way on its first attempt, to show the retry changes nothing;
* the long-running sender (what ``wsrm send`` runs) delivering the messages.

At the end it checks both sides hold every order exactly once::

    python examples/spark_orders.py --orders 2000 --partitions 4
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

import psycopg2  # noqa: E402
from spyne import Application, ServiceBase, Unicode, rpc  # noqa: E402
from spyne.protocol.soap import Soap11  # noqa: E402

from interceptors.spyne_server.service import reliable_service  # noqa: E402
from txmanager import TransactionManager  # noqa: E402
from wsrm_plugin.tools.pgserver import ThrowawayPostgres  # noqa: E402
from txmanager.postgres import XADataSource  # noqa: E402
from wsrm_plugin.engine import RMPolicy  # noqa: E402
from wsrm_plugin.spark import Sender, register  # noqa: E402

log = logging.getLogger("spark_orders")
TNS = "urn:example:orders"
_orders_ds: XADataSource | None = None


class OrderService(ServiceBase):
    @rpc(Unicode, _is_async=True)
    def record(ctx, order):
        """Record one order in the service's database (inside the delivery's XA transaction)."""
        with _orders_ds.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO received (order_id) VALUES (%s)", (order,))


def _execute(dsn: str, statement: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


def _count(dsn: str, table: str) -> tuple[int, int]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*), count(DISTINCT order_id) FROM {table}")
            return cur.fetchone()
    finally:
        conn.close()


def main() -> int:
    global _orders_ds
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("py4j", "wsrm_plugin.engine", "interceptors", "txmanager", "zeep"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    work = Path(tempfile.mkdtemp(prefix="spark-orders-"))
    with ThrowawayPostgres() as pg:
        shop = pg.create_database("shop")
        rms = pg.create_database("rms")
        service_db = pg.create_database("service")
        _execute(shop, "CREATE TABLE orders_sent (order_id text NOT NULL, amount int NOT NULL)")
        _execute(service_db, "CREATE TABLE received (order_id text NOT NULL)")

        # the service: WS-RM + XA into its own database
        service_tm = TransactionManager(node="orders-svc", log=work / "service-tm.log")
        _orders_ds = XADataSource(service_db, service_tm)
        app = Application([OrderService], tns=TNS, name="OrderService", in_protocol=Soap11(validator="lxml"),
                          out_protocol=Soap11())
        policy = RMPolicy(soap_version="1.1", base_retransmission_interval=0.5)
        service = reliable_service(app, "postgresql:" + service_db, policy, tm=service_tm)
        service.serve()
        service.start()
        log.info("OrderService at %s", service.url)

        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2,3]").appName("spark-orders")
                 .config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        orders = spark.range(args.orders, numPartitions=args.partitions).selectExpr(
            "format_string('order-%06d', id) AS order_id", "CAST(id % 97 + 1 AS INT) AS amount")
        started = time.monotonic()
        (orders.selectExpr("order_id AS `order`", "order_id", "amount")
            .write.format("wsrm").mode("append")
            .option("target", service.url).option("operation", "record")
            .option("fields", "order")                      # the operation's argument
            .option("columns", "order_id,amount")           # the shop table's columns
            .option("store", "postgresql:" + rms)           # the shared WS-RM message store
            .option("log", str(work / "driver-tm.log"))     # the driver's commit decisions
            .option("database", shop).option("table", "orders_sent")
            .option("node", "orders-job").option("jobName", "orders")
            .save())
        log.info("Spark job committed %d orders in %.1fs; delivering", args.orders, time.monotonic() - started)
        spark.stop()

        with Sender("postgresql:" + rms, policy) as sender:  # what `wsrm send --until-acked` does
            sender.wait_until_idle(timeout=600, report_every=2.0, out=sys.stdout)
        deadline = time.monotonic() + 120
        while _count(service_db, "received")[0] < args.orders and time.monotonic() < deadline:
            time.sleep(0.2)
        sent, received = _count(shop, "orders_sent"), _count(service_db, "received")
        service.stop()
        _orders_ds.close()
        service_tm.close()
        log.info("shop table: %d rows (%d distinct); service recorded: %d (%d distinct); took %.1fs",
                 *sent, *received, time.monotonic() - started)
        ok = sent == received == (args.orders, args.orders)
        print("OK: every order written once and delivered once" if ok else "MISMATCH")
        return 0 if ok else 1



if __name__ == "__main__":
    sys.exit(main())
