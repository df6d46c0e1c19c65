"""Spark local mode, a reliable spyne OrderService recording into its own database, and the client's
databases (rows + the shared message store), all real."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest

from interceptors.spyne_server.service import ReliableService, reliable_service
from tests.spyne_server import service
from txmanager import TransactionManager
from txmanager.postgres import XADataSource
from wsrm_plugin.engine import RMPolicy

ROOT = Path(__file__).resolve().parents[2]
FAST = dict(base_retransmission_interval=0.3, exponential_backoff=False, poll_interval=0.05,
            http_timeout=10.0, soap_version="1.1")


def spark_env() -> None:
    """What Spark's Python workers need to find this interpreter and the test modules."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    path = os.environ.get("PYTHONPATH", "")
    if str(ROOT) not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), path) if p)


def build_session(master: str = "local[2,3]", **conf: str):
    spark_env()
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("wsrm-spark-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.python.worker.reuse", "true"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from tests.spark.faults import FaultyDataSource
    from wsrm_plugin.spark import register

    register(spark)
    spark.dataSource.register(FaultyDataSource)
    return spark


@pytest.fixture(scope="session")
def spark():
    session = build_session()
    yield session
    session.stop()


def query(dsn: str, sql: str) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


def execute(dsn: str, sql: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@dataclass
class World:
    """Both sides of one test: the service (its URL and database) and the client's databases."""

    server: ReliableService
    server_db: str
    client_db: str
    store: str
    log: str
    marker: str

    @property
    def url(self) -> str:
        return self.server.url

    def options(self, **extra: str) -> dict[str, str]:
        return {"target": self.url, "operation": "record", "fields": "item", "store": self.store,
                "log": self.log, "database": self.client_db, "table": "sent", "batchSize": "10",
                "node": "sparktest", "marker": self.marker, **extra}

    def sent(self) -> list[str]:
        return [r[0] for r in query(self.client_db, "SELECT item FROM sent")]

    def recorded(self) -> list[str]:
        return [r[0] for r in query(self.server_db, "SELECT item FROM orders")]

    def prepared(self) -> list[str]:
        """Prepared transactions left in this test's databases.

        Not the whole server's: the server is shared with the other tests of this worker, and a
        test killed mid-transaction elsewhere (a demo past its timeout) must not fail this one.
        """
        gids: list[str] = []
        for dsn in (self.client_db, self.server_db, self.store.removeprefix("postgresql:")):
            gids += [r[0] for r in query(
                dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]
        return gids

    def wait_recorded(self, count: int, timeout: float = 90.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.recorded()
            if len(got) >= count and self.server.engine.status().buffered == 0:
                return got
            time.sleep(0.2)
        return self.recorded()


@pytest.fixture
def world(pg_dsn_factory, tmp_path) -> Iterator[World]:
    server_db = pg_dsn_factory("srv")
    execute(server_db, service.SCHEMA)
    client_db = pg_dsn_factory("cli")
    execute(client_db, "CREATE TABLE sent (item text NOT NULL)")  # no key: a duplicate would show
    store = "postgresql:" + pg_dsn_factory("rms")
    tm = TransactionManager(node="spark-srv", log=tmp_path / "server-tm.log")
    ds = XADataSource(server_db, tm)
    service.reset()
    service.configure(ds=ds)
    server = reliable_service(service.application(), "postgresql:" + server_db,
                              RMPolicy(**FAST), tm=tm)
    server.serve()
    server.start()
    try:
        yield World(server, server_db, client_db, store, str(tmp_path / "driver-tm.log"),
                    str(tmp_path / "faults.txt"))
    finally:
        server.stop(timeout=5)
        service.reset()
        ds.close()
        tm.close()


def items(n: int) -> list[str]:
    return [f"order-{i:05d}" for i in range(n)]

