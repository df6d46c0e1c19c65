"""``wsrm status`` on a store with known sequences; the Prometheus exposition and the metrics endpoint."""

from __future__ import annotations

import io
import re
import threading
import time
import urllib.error
import urllib.request
from wsgiref.util import setup_testing_defaults

import pytest

from wsrm_plugin.cli import main
from wsrm_plugin.tools.demo import free_port
from wsrm_plugin.metrics import CONTENT_TYPE, exposition, metrics_app, serve_forever
from wsrm_plugin.status import report
from wsrm_plugin.store import open_store

# The text exposition format, line by line (https://prometheus.io/docs/instrumenting/exposition_formats/)
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABELS = r'\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"(?:,(?!\}))?)*\}'
SAMPLE = re.compile(rf"^({NAME})({LABELS})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$")
COMMENT = re.compile(rf"^# (?:HELP {NAME} .*|TYPE {NAME} (?:counter|gauge|histogram|summary|untyped))$")


def parse_exposition(text: str) -> dict[str, float]:
    """Every sample as ``name{labels}`` -> value; fails on any line that is not valid exposition."""
    assert text.endswith("\n")
    samples: dict[str, float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("#"):
            assert COMMENT.match(line), f"bad comment line {line!r}"
            if line.startswith("# TYPE "):
                typed.add(line.split()[2])
            continue
        match = SAMPLE.match(line)
        assert match, f"bad sample line {line!r}"
        assert match.group(1) in typed, f"{match.group(1)} has no TYPE line before it"
        samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


@pytest.fixture
def store_url(tmp_path):
    """A SQLite store with one source sequence (3 messages, #1 sent twice, #2 acked) and one destination."""
    url = f"sqlite:///{tmp_path}/rm.db"
    store = open_store(url)
    now = time.time()
    with store.begin() as tx:
        tx.rmd.create("urn:uuid:inbound-1", acks_to="http://peer/acks", rm_version="1.1",
                      wsa_version="2005/08", now=now)
        tx.rmd.record_received("urn:uuid:inbound-1", 1, now=now)
        tx.rmd.record_received("urn:uuid:inbound-1", 2, now=now)
        tx.rms.create("orders", target="http://peer/", acks_to="anon", rm_version="1.1",
                      wsa_version="2005/08", now=now)
        tx.rms.update("orders", sequence_id="urn:uuid:outbound-1", started=True)
        for n in range(3):
            tx.rms_messages.enqueue("orders", b"<e/>", action="urn:a", soap_version="1.1",
                                    message_id=f"urn:uuid:m{n}", now=now)
        for n in (1, 2, 3):
            tx.rms_messages.record_send_attempt("orders", n, next_send_at=now + 5, now=now)
        tx.rms_messages.record_send_attempt("orders", 1, next_send_at=now + 5, now=now)
        tx.rms_messages.mark_acked("orders", [(2, 2)], now=now)
    store.close()
    return url


def test_status_lists_the_sequences_and_counters(store_url, capsys):
    assert main(["status", "--store", store_url]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines()
            if line.startswith(("source ", "destination "))}
    assert rows["urn:uuid:outbound-1"][:5] == ["source", "urn:uuid:outbound-1", "started", "2", "1"]
    assert rows["urn:uuid:inbound-1"][:6] == ["destination", "urn:uuid:inbound-1", "receiving", "-", "-", "1-2"]
    assert re.search(r"unacknowledged messages\s+2\n", out)
    assert re.search(r"retransmissions\s+1\n", out)
    assert re.search(r"faulted sequences\s+0\n", out)
    assert re.search(r"in-doubt transactions\s+0\n", out)
    assert time.strftime("%Y-%m-%d") in rows["urn:uuid:outbound-1"][-2]  # last activity, as a date


def test_prometheus_output_parses(store_url, capsys):
    assert main(["status", "--store", store_url, "--prometheus"]) == 0
    samples = parse_exposition(capsys.readouterr().out)
    assert samples["wsrm_unacknowledged_messages"] == 2
    assert samples["wsrm_retransmissions"] == 1
    assert samples["wsrm_faulted_sequences"] == 0
    assert samples["wsrm_in_doubt_transactions"] == 0
    assert samples['wsrm_sequences{side="source",state="started"}'] == 1
    assert samples['wsrm_sequences{side="destination",state="receiving"}'] == 1
    assert samples['wsrm_sequence_unacknowledged_messages{sequence="urn:uuid:outbound-1"}'] == 2


def test_labels_are_escaped():
    from wsrm_plugin.status import SequenceRow, StoreReport

    r = StoreReport("memory:", (SequenceRow("source", 'odd"id\\x', "started", 1, 0, "1", 0.0),),
                    1, 0, 0, 0, 0, {})
    samples = parse_exposition(exposition(r))
    assert samples['wsrm_sequence_unacknowledged_messages{sequence="odd\\"id\\\\x"}'] == 1


def test_metrics_app_answers_get_metrics_only(store_url):
    store = open_store(store_url)
    try:
        app = metrics_app(store)

        def call(path, method="GET"):
            environ: dict = {}
            setup_testing_defaults(environ)
            environ.update(PATH_INFO=path, REQUEST_METHOD=method)
            seen = {}
            body = b"".join(app(environ, lambda status, headers: seen.update(status=status, headers=headers)))
            return seen["status"], dict(seen["headers"]), body

        status, headers, body = call("/metrics")
        assert status.startswith("200") and headers["Content-Type"] == CONTENT_TYPE
        assert parse_exposition(body.decode())["wsrm_unacknowledged_messages"] == 2
        assert call("/other")[0].startswith("404")
        assert call("/metrics", "POST")[0].startswith("405")
    finally:
        store.close()


def test_serve_metrics_over_http(store_url):
    store = open_store(store_url)
    stop = threading.Event()
    port = free_port()
    thread = threading.Thread(target=serve_forever, args=(store, "127.0.0.1", port),
                              kwargs=dict(out=io.StringIO(), stop=stop), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                    text = answer.read().decode()
                break
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        assert parse_exposition(text)["wsrm_retransmissions"] == 1
    finally:
        stop.set()
        thread.join(30)
        store.close()
    assert not thread.is_alive()


def test_report_of_an_empty_store():
    store = open_store("memory:")
    r = report(store)
    assert r.sequences == () and r.unacknowledged == 0
    store.close()


def test_status_refuses_a_bad_store_url(capsys):
    assert main(["status", "--store", "nosuch:///x"]) == 2
    assert "unsupported store URL" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["status"], ["poison", "list"], ["resend", "--all"]])
def test_operator_commands_refuse_a_store_that_is_not_there(command, tmp_path, capsys):
    """A mistyped path must not be created as an empty store and reported as "all fine"."""
    missing = tmp_path / "servcie-rm.db"  # the typo
    assert main([*command, "--store", f"sqlite:///{missing}"]) == 2
    err = capsys.readouterr().err
    assert "no SQLite store at" in err and str(missing) in err
    assert not missing.exists()

    assert main([*command, "--store", "memory:"]) == 2
    assert "memory store" in capsys.readouterr().err

    # an existing file that is not a store is not turned into one either
    other = tmp_path / "other.db"
    import sqlite3
    sqlite3.connect(other).execute("CREATE TABLE unrelated (x)").connection.commit()
    assert main([*command, "--store", f"sqlite:///{other}"]) == 2
    assert "no message store" in capsys.readouterr().err
    tables = {row[0] for row in sqlite3.connect(other).execute("SELECT name FROM sqlite_master")}
    assert tables == {"unrelated"}


def test_status_refuses_a_postgresql_database_without_a_store(pg_dsn_factory, capsys):
    import psycopg2

    dsn = pg_dsn_factory("nostore")
    assert main(["status", "--store", "postgresql:" + dsn]) == 2
    assert "no message store" in capsys.readouterr().err
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'")
            assert cur.fetchone()[0] == 0  # nothing created
    finally:
        conn.close()
    # and a real store there is read
    open_store("postgresql:" + dsn).close()
    assert main(["status", "--store", "postgresql:" + dsn]) == 0
