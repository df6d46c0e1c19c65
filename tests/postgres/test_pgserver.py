"""The throwaway PostgreSQL server: start, crash, restart on the same data, clean up."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import psycopg2
import psycopg2.errors
import pytest

from tests.conftest import start_throwaway_server
from wsrm_plugin.tools.pgserver import (
    PostgresNotInstalledError, PostgresServerError, ThrowawayPostgres, find_bindir, is_process_alive,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
def server():
    """A server of the test's own: these tests kill it."""
    pg = start_throwaway_server()
    try:
        yield pg
    finally:
        pg.close()


def query(pg: ThrowawayPostgres, dbname: str, sql: str, params=()):
    conn = pg.connect(dbname)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def still_running(pids: list[int]) -> list[int]:
    """The pids of ``pids`` still alive after a generous grace (a process that
    finishes exiting on its own has released its working directory, memory and
    files already, but may still show for a moment)."""
    deadline = time.monotonic() + 15
    while any(is_process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [p for p in pids if is_process_alive(p)]


class BusyBackend:
    """A backend stuck in a CPU-bound query: unlike an idle one, it does not notice
    its postmaster's death, so only an explicit kill ends it."""

    def __init__(self, pg: ThrowawayPostgres) -> None:
        self.conn = pg.connect()
        self.pid = self.conn.get_backend_pid()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()
        watcher = pg.connect()
        watcher.autocommit = True
        try:
            with watcher.cursor() as cur:
                for _ in range(3000):
                    cur.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (self.pid,))
                    if cur.fetchone() == ("active",):
                        break
                    time.sleep(0.01)
                else:
                    raise AssertionError("the busy query never started")
        finally:
            watcher.close()

    def _spin(self) -> None:
        try:
            with self.conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM generate_series(1, 1000000000000)")
        except psycopg2.Error:
            pass  # the server went away under it: the point of the test

    def close(self) -> None:
        self.thread.join(60)
        self.conn.close()


def test_binaries_are_found():
    assert ThrowawayPostgres.available()
    bindir = find_bindir()
    assert (bindir / "initdb").exists() and (bindir / "postgres").exists()


def test_an_explicit_bindir_without_a_server_is_refused(tmp_path):
    assert not ThrowawayPostgres.available(tmp_path)
    with pytest.raises(PostgresNotInstalledError, match="holds no initdb and postgres"):
        find_bindir(tmp_path)


def test_two_databases_survive_a_kill_and_a_restart_then_close_leaves_nothing(server):
    assert query(server, "postgres", "SHOW max_prepared_transactions") == [("64",)]
    assert query(server, "postgres", "SHOW fsync") == [("on",)]
    dsn_a = server.create_database("bank_a")
    dsn_b = server.create_database("bank_b")
    assert "dbname=bank_a" in dsn_a and f"port={server.port}" in dsn_a
    for db in ("bank_a", "bank_b"):
        query(server, db, "CREATE TABLE t (id int PRIMARY KEY, db text)")
        query(server, db, "INSERT INTO t VALUES (1, %s)", (db,))
    busy = BusyBackend(server)  # a backend that outlives its postmaster unless killed
    pids = server.pids()
    assert server.pid in pids and busy.pid in pids, "postmaster and its children"
    postmaster = server.pid

    server.kill()
    assert not server.running
    assert not is_process_alive(postmaster) and not is_process_alive(busy.pid), "kill() kills them all"
    assert not still_running(pids), "kill() leaves no process behind"
    with pytest.raises(psycopg2.OperationalError):
        server.connect("bank_a", connect_timeout=2)
    busy.close()

    data_dir = server.data_dir
    server.start()  # crash recovery on the same data directory
    assert server.data_dir == data_dir
    assert query(server, "bank_a", "SELECT db FROM t") == [("bank_a",)]
    assert query(server, "bank_b", "SELECT db FROM t") == [("bank_b",)]

    pids = server.pids()
    server.close()
    assert not still_running(pids), "close() leaves no process behind"
    assert not data_dir.exists(), "the temporary data directory is removed"


def test_a_prepared_transaction_survives_kill_9_and_keeps_its_row_lock(server):
    server.create_database("db1")
    query(server, "db1", "CREATE TABLE t (id int PRIMARY KEY, v text)")
    query(server, "db1", "INSERT INTO t VALUES (1, 'before')")
    conn = server.connect("db1")
    conn.tpc_begin("survivor")
    with conn.cursor() as cur:
        cur.execute("UPDATE t SET v = 'after' WHERE id = 1")
    conn.tpc_prepare()

    server.kill()
    conn.close()
    server.start()

    assert query(server, "db1", "SELECT gid, database FROM pg_prepared_xacts") == [("survivor", "db1")]
    other = server.connect("db1")
    try:
        with pytest.raises(psycopg2.errors.LockNotAvailable):
            with other.cursor() as cur:
                cur.execute("SELECT v FROM t WHERE id = 1 FOR UPDATE NOWAIT")
        other.rollback()
        with other.cursor() as cur:
            cur.execute("SELECT v FROM t WHERE id = 1")  # readers are not blocked
            assert cur.fetchone() == ("before",)
        other.rollback()
        other.autocommit = True
        other.tpc_commit("survivor")
        with other.cursor() as cur:
            cur.execute("SELECT v FROM t WHERE id = 1 FOR UPDATE NOWAIT")
            assert cur.fetchone() == ("after",)
    finally:
        other.close()


def test_a_postmaster_killed_from_outside_is_reaped_with_its_orphans(server):
    idle = server.connect()
    busy = BusyBackend(server)
    pids = server.pids()
    os.kill(server.pid, signal.SIGKILL)  # what a crash test's kill point does
    server.wait_killed()
    assert not is_process_alive(busy.pid), "an orphan that would block the restart is killed"
    assert not still_running(pids)
    assert server.pids() == []
    server.start()
    assert query(server, "postgres", "SELECT 1") == [(1,)]
    idle.close()
    busy.close()


def test_stop_then_start_again(server):
    server.create_database("kept")
    query(server, "kept", "CREATE TABLE t (id int)")
    server.stop()
    assert not server.running and server.pids() == []
    server.start()
    assert query(server, "kept", "SELECT count(*) FROM t") == [(0,)]


def test_a_failed_start_reports_the_server_log():
    pg = ThrowawayPostgres(settings={"shared_buffers": "lots"})
    try:
        with pytest.raises(PostgresServerError, match=r"(?s)exited with code.*shared_buffers"):
            pg.start()
        assert not pg.running
    finally:
        pg.close()


def test_database_names_are_checked(pg_server):
    with pytest.raises(ValueError, match="database name"):
        pg_server.create_database("x; DROP DATABASE postgres")
    with pytest.raises(psycopg2.errors.DuplicateDatabase):
        pg_server.create_database("postgres")


def test_a_given_data_directory_is_kept_and_reused():
    base = Path(tempfile.mkdtemp(prefix="wsrm-pg-test-"))
    os.chmod(base, 0o755)  # the server's OS user must reach the data directory
    try:
        data = base / "pgdata"
        with ThrowawayPostgres(data_dir=data) as pg:
            pg.create_database("app")
            query(pg, "app", "CREATE TABLE t (v text)")
            query(pg, "app", "INSERT INTO t VALUES ('kept')")
        assert (data / "PG_VERSION").exists(), "a caller's directory is never deleted"
        with ThrowawayPostgres(data_dir=data) as pg:
            assert query(pg, "app", "SELECT v FROM t") == [("kept",)]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_data_directory_the_server_user_cannot_reach_is_refused_with_the_reason(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only a root process hands the server to another OS user")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    pg = ThrowawayPostgres(data_dir=locked / "pgdata")
    try:
        with pytest.raises(PostgresServerError, match="cannot enter"):
            pg.start()
    finally:
        pg.close()


def _lifecycle_as_current_user() -> str:
    """Start, query, crash, restart, close; returns what the server says its user is."""
    with ThrowawayPostgres() as pg:
        who = query(pg, "postgres", "SELECT current_user")[0][0]
        pg.kill()
        pg.start()
        assert query(pg, "postgres", "SELECT 1") == [(1,)]
        data_dir = pg.data_dir
    assert not data_dir.exists()
    return who


def test_the_non_root_path():
    """As non-root the server runs as the calling user, with no user switch.

    Run as root, this forks a child that drops to the ``postgres`` user and
    drives the harness from there (the interpreter is already loaded, so the
    child needs no access to it on disk).
    """
    if os.geteuid() != 0:
        assert _lifecycle_as_current_user() == "postgres"
        return
    user = pwd.getpwnam("postgres")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.environ["HOME"] = user.pw_dir
            who = _lifecycle_as_current_user()
            os.write(write_end, f"ok {who} uid={os.geteuid()}".encode())
            code = 0
        except BaseException as exc:  # noqa: BLE001 -- report anything to the parent
            os.write(write_end, f"error {type(exc).__name__}: {exc}".encode()[:4000])
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        report = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, report
    assert report == f"ok postgres uid={user.pw_uid}"
