"""``wsrm demo`` end to end, as a user runs it: a subprocess, its exit status and its last line."""

from __future__ import annotations

import glob
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wsrm_plugin.tools.demo import verify

ROOT = Path(__file__).resolve().parents[2]
WSRM = [sys.executable, "-m", "wsrm_plugin.cli"]
RESULT = re.compile(r"(\d+) delivered, (\d+) lost, (\d+) duplicated")


def run_demo(*options: str, timeout: float = 240, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    if "--timeout" not in options:
        # the demo gives up first, so a stuck run ends with its verdict and both peers' logs
        options = (*options, "--timeout", str(timeout - 60))
    done = subprocess.run([*WSRM, "demo", *options], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


def last_result(stdout: str) -> tuple[int, int, int]:
    lines = stdout.strip().splitlines()
    assert lines, "the demo printed nothing"
    match = RESULT.search(lines[-1])
    assert match, f"the last line does not state the counts: {lines[-1]!r}"
    return tuple(int(n) for n in match.groups())  # type: ignore[return-value]


def assert_exactly_once(rc: int, out: str, err: str, messages: int = 100) -> None:
    assert (rc, last_result(out)) == (0, (messages, 0, 0)), f"{out}\n{err[-3000:]}"


def test_default_run_delivers_100_messages_exactly_once():
    rc, out, err = run_demo()
    assert_exactly_once(rc, out, err)
    assert "20% of requests lost" in out
    assert re.search(r"\d+ requests and \d+ responses dropped", out)  # the proxy really dropped traffic
    assert "] 100/100" in err  # the progress bar reached the end


def test_memory_store():
    rc, out, err = run_demo("--store", "memory")
    assert_exactly_once(rc, out, err)
    assert "memory stores" in out


def test_in_out_replies_come_back_once_each():
    rc, out, err = run_demo("--in-out")
    assert_exactly_once(rc, out, err)
    assert out.count("proxy http://") == 2  # requests and replies both cross a lossy proxy


@pytest.mark.slow
def test_crash_kills_and_restarts_client_and_server():
    rc, out, err = run_demo("--crash")
    assert_exactly_once(rc, out, err)
    assert "killed the client (SIGKILL)" in out and "killed the server (SIGKILL)" in out


@pytest.mark.slow
def test_crash_in_out():
    rc, out, err = run_demo("--crash", "--in-out", "--messages", "60")
    assert_exactly_once(rc, out, err, 60)


@pytest.mark.slow
def test_crash_in_out_where_the_client_dies_before_it_stores_the_create_sequence_response():
    """The seed that lost all 60 replies: the restarted client sent CreateSequence again with a
    new MessageID and the same offer, got a second sequence with the offer declined, and the
    service dropped every reply (tests/engine/test_repeated_offer.py has the protocol level)."""
    rc, out, err = run_demo("--crash", "--in-out", "--messages", "60", "--seed", "1378978650")
    assert_exactly_once(rc, out, err, 60)


@pytest.mark.slow
@pytest.mark.postgres
def test_xa_application_client_to_application_server_with_crashes(pg_server):
    rc, out, err = run_demo("--xa", "--crash", "--dsn", pg_server.dsn())
    assert_exactly_once(rc, out, err)
    assert "APPLICATION_CLIENT -> APPLICATION_SERVER" in out


@pytest.mark.slow
@pytest.mark.postgres
def test_xa_starts_its_own_postgres():
    rc, out, err = run_demo("--xa", "--messages", "30")
    assert_exactly_once(rc, out, err, 30)


def test_a_network_that_loses_everything_fails_the_demo():
    rc, out, err = run_demo("--loss", "1", "--messages", "5", "--timeout", "6")
    assert rc == 1, out + err
    assert last_result(out) == (0, 5, 0)
    assert out.strip().splitlines()[-1].startswith("FAILED")


def test_a_duplicate_row_in_the_server_database_fails_the_demo(tmp_path):
    """The verdict reads the server's application table: tamper with it mid-run and the demo must say so."""
    child = subprocess.Popen([*WSRM, "demo", "--messages", "40"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        tampered = False
        while not tampered and time.monotonic() < deadline and child.poll() is None:
            for db in glob.glob(str(tmp_path / "wsrm-demo-*" / "server.db")):
                conn = sqlite3.connect(db, timeout=30)
                try:
                    with conn:
                        conn.execute("INSERT INTO application_server VALUES ('m00001', 'forged', 1)")
                    tampered = True
                except sqlite3.OperationalError:  # the server has not created its table yet
                    pass
                finally:
                    conn.close()
            time.sleep(0.01)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert tampered, "the demo ended before the test could tamper with it"
    assert child.returncode == 1, out + err
    assert last_result(out) == (39, 0, 1)


def test_bad_options_are_refused_with_a_reason():
    rc, out, err = run_demo("--crash", "--store", "memory")
    assert rc == 2
    assert "--crash needs a durable store" in err
    rc, out, err = run_demo("--loss", "1.5")
    assert rc == 2 and "probability" in err


# -- the verdict itself -----------------------------------------------------------------------------

def test_verify_counts_each_message_once():
    sent = ["a", "b", "c", "d"]
    v = verify(sent, ["a", "b", "b", "d", "zz"])
    assert (v.delivered, v.lost, v.duplicated, v.unexpected, v.ok) == (2, 1, 1, 1, False)
    assert verify(sent, sent).ok and verify(sent, sent).in_order
    assert not verify(sent, ["b", "a", "c", "d"]).in_order


def test_verify_in_out_needs_each_reply_once():
    sent = ["a", "b", "c"]
    v = verify(sent, sent, ["a", "c", "c"])
    assert (v.delivered, v.lost, v.duplicated, v.ok) == (1, 1, 1, False)
    assert verify(sent, sent, ["c", "a", "b"]).ok


@pytest.mark.postgres
def test_the_server_rows_are_read_in_the_order_they_were_inserted_on_postgresql(pg_dsn_factory):
    """Where a rolled-back insert left room (the server killed during a delivery), PostgreSQL puts
    a later row there: read by its location (ctid), m3 came before m2, and the crash demo said
    "out of order" of an application that saw every message in order."""
    import psycopg2

    from wsrm_plugin.store import open_store
    from wsrm_plugin.tools.demo import Rows
    from wsrm_plugin.tools.demo_peer import SERVER_TABLE, Records

    dsn = pg_dsn_factory("demo_order")
    store = open_store("postgresql:" + dsn)
    try:
        Records("store", store=store).create_tables(SERVER_TABLE)
        conn = psycopg2.connect(dsn)
        try:
            with conn.cursor() as cur:  # as the deliveries do: positional values, one transaction each
                for item, keep in (("m1", False), ("m2", True), ("m3", True)):
                    if item == "m3":
                        conn.autocommit = True
                        cur.execute(f"VACUUM {SERVER_TABLE}")  # m1's room is free again
                        conn.autocommit = False
                    cur.execute(f"INSERT INTO {SERVER_TABLE} VALUES (%s, %s, %s)", (item, "s", 1))
                    conn.commit() if keep else conn.rollback()
                cur.execute(f"SELECT item FROM {SERVER_TABLE} ORDER BY ctid")
                assert [r[0] for r in cur.fetchall()] == ["m3", "m2"]  # where they are: not the order
        finally:
            conn.close()
        assert Rows("postgresql", dsn).items(SERVER_TABLE) == ["m2", "m3"]
        assert verify(["m2", "m3"], Rows("postgresql", dsn).items(SERVER_TABLE)).in_order
    finally:
        store.close()
