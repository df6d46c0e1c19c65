"""Fail fast at start-up (issue 14, items 1 and 6): a PostgreSQL that cannot
prepare, a recovery log whose directory is missing, and ``wsrm recover`` given
a wrong log path or node -- each one clear line, before anything is accepted."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import start_throwaway_server
from txmanager import (
    MemoryResource,
    PreparedTransactionsDisabledError,
    RecoveryLogError,
    TransactionManager,
)
from txmanager.postgres import PostgresXAResource, XADataSource

WSRM = os.path.join(os.path.dirname(sys.executable), "wsrm")


@pytest.fixture(scope="module")
def no_prepare_server():
    """A real throwaway PostgreSQL with PostgreSQL's own default: no prepared transactions."""
    server = start_throwaway_server(settings={"max_prepared_transactions": 0})
    try:
        server.create_database("app")
        yield server
    finally:
        server.close()


@pytest.mark.postgres
def test_a_data_source_on_a_server_without_prepared_transactions_is_refused(
        no_prepare_server, tmp_path):
    with no_prepare_server.connect("app") as conn, conn.cursor() as cur:
        cur.execute("SHOW max_prepared_transactions")
        assert cur.fetchone()[0] == "0"
    tm = TransactionManager(node="startup", log=tmp_path / "tm.log")
    try:
        with pytest.raises(PreparedTransactionsDisabledError,
                           match="max_prepared_transactions = 0.*set max_prepared_transactions"):
            XADataSource(no_prepare_server.dsn("app"), tm)
        assert tm.recovery.recover_once().errors == [], "nothing half-registered"
    finally:
        tm.close()


@pytest.mark.postgres
def test_a_resource_is_refused_at_its_first_connection_before_any_work(
        no_prepare_server, tmp_path):
    """A resource made directly (no data source): enlisting it -- the first thing
    a transaction does with it -- raises, so no work is ever accepted on it."""
    tm = TransactionManager(node="startup", log=tmp_path / "tm.log")
    other = MemoryResource("other")
    try:
        resource = PostgresXAResource(no_prepare_server.dsn("app"))
        tx = tm.begin()
        tx.enlist_resource(other)
        other.put("k", 1)
        tx.delist_resource(other)
        with pytest.raises(PreparedTransactionsDisabledError, match="max_prepared_transactions"):
            tx.enlist_resource(resource)
        tm.rollback()
        assert other.snapshot() == {}
    finally:
        tm.close()


@pytest.mark.postgres
def test_the_same_data_source_on_a_server_with_prepared_transactions_starts(pg_dsn_factory,
                                                                           tmp_path):
    """The control: the check passes where PREPARE works (so the refusal above is the check)."""
    dsn = pg_dsn_factory("startup")
    tm = TransactionManager(node="startup", log=tmp_path / "tm.log")
    try:
        with XADataSource(dsn, tm) as ds, tm.transaction(), ds.connection() as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
    finally:
        tm.close()


def test_a_recovery_log_in_a_missing_directory_is_refused_when_the_manager_is_created(tmp_path):
    missing = tmp_path / "no-such-dir" / "tm.log"
    with pytest.raises(RecoveryLogError, match=r"directory of recovery log .* does not exist"):
        TransactionManager(node="startup", log=missing)
    assert not (tmp_path / "no-such-dir").exists()


def test_a_log_that_names_another_node_is_refused(tmp_path):
    TransactionManager(node="first", log=tmp_path / "tm.log").close()
    with pytest.raises(RecoveryLogError, match="belongs to node 'first', not 'second'"):
        TransactionManager(node="second", log=tmp_path / "tm.log")
    TransactionManager(node="first", log=tmp_path / "tm.log").close()  # its own node: fine


# -- wsrm recover ---------------------------------------------------------------------------


def _recover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([WSRM, "recover", *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_wsrm_recover_with_a_mistyped_log_path_creates_nothing(tmp_path):
    TransactionManager(node="op", log=tmp_path / "tx.log").close()
    typo = tmp_path / "tx.lgo"
    out = _recover("--log", str(typo))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"wsrm recover: there is no recovery log at {typo} (check the path)"]
    assert out.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tx.log", "tx.log.lock"]


def test_wsrm_recover_with_a_log_in_a_missing_directory_is_one_line(tmp_path):
    out = _recover("--log", str(tmp_path / "gone" / "tx.log"))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0] and "Traceback" not in out.stderr
    assert not (tmp_path / "gone").exists()


def test_wsrm_recover_with_a_node_the_log_does_not_name_says_so(tmp_path):
    log = tmp_path / "tx.log"
    TransactionManager(node="shop-1", log=log).close()
    out = _recover("--log", str(log), "--node", "shop-2")
    assert out.returncode == 2
    assert out.stderr.strip() == (f"wsrm recover: recovery log {log} is the log of node "
                                  "'shop-1', not 'shop-2'; check --node (or leave it out)")


def test_nothing_in_doubt_is_an_answer_that_names_what_was_looked_at(tmp_path):
    log = tmp_path / "tx.log"
    TransactionManager(node="shop-1", log=log).close()
    out = _recover("--log", str(log))
    assert out.returncode == 0, out.stderr
    first, last = out.stdout.strip().splitlines()
    assert first.startswith(f"log {log} (node shop-1, 0 decision(s) pending)")
    assert "databases: none given (only the log was read)" in first
    assert last == "no in-doubt transactions"
