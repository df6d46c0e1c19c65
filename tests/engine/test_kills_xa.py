"""Kill -9 at random instants with XA: the client's ``sent`` row with its enqueue and the service's
``delivered`` row with its dequeue, both or neither, kills inside two-phase commit included, and
no prepared branch left behind (the runs: :mod:`.kills`)."""

from __future__ import annotations

import pytest

from .kills import store_url, xa_kill_run


@pytest.mark.slow(minutes=0.75)
@pytest.mark.postgres
@pytest.mark.parametrize("server_kind,client_kind", [("sqlite", "postgresql"), ("postgresql", "sqlite")])
def test_xa_both_or_neither_across_random_sigkills(server_kind, client_kind, tmp_path, request, pg_dsn_factory):
    server_app, client_app = pg_dsn_factory("xasrvapp"), pg_dsn_factory("xacliapp")
    server_store = store_url(server_kind, "xasrv", tmp_path, request)
    client_store = store_url(client_kind, "xacli", tmp_path, request)
    xa_kill_run(tmp_path, server_app, client_app, server_store, client_store, count=150, kills=12)


@pytest.mark.slow(minutes=1.25)
@pytest.mark.postgres
def test_one_database_one_phase_across_random_sigkills(tmp_path, pg_dsn_factory):
    """Each store in its application's database: every transaction is ONE branch, committed in one
    phase (no PREPARE, no logged decision), and kills at random instants still lose, repeat and
    leave in doubt nothing."""
    server_app, client_app = pg_dsn_factory("xasrvone"), pg_dsn_factory("xaclione")
    xa_kill_run(tmp_path, server_app, client_app, "postgresql:" + server_app, "postgresql:" + client_app,
                 count=150, kills=20)
    # one phase throughout: no transaction ever logged a commit decision
    for log_file in ("srv.tmlog", "cli.tmlog"):
        path = tmp_path / log_file
        assert not path.exists() or b"commit" not in path.read_bytes().lower(), log_file


@pytest.mark.slow(minutes=1.25)
@pytest.mark.postgres
def test_xa_16_sequences_delivered_together_across_random_sigkills(tmp_path, request, pg_dsn_factory):
    """XA across two databases on each side, the client sending on 16 sequences at once: the
    service's receives under way together are delivered in one global transaction
    (``RMPolicy.receive_together``; the next batch starts while one commits), and kills at random
    instants still lose, repeat and leave in doubt nothing.  Batches formed: some global
    transactions delivered several messages (their rows share the application branch's
    transaction id)."""
    import psycopg2

    server_app, client_app = pg_dsn_factory("xasrv16"), pg_dsn_factory("xacli16")
    server_store = store_url("postgresql", "xasrv16s", tmp_path, request)
    client_store = store_url("postgresql", "xacli16s", tmp_path, request)
    xa_kill_run(tmp_path, server_app, client_app, server_store, client_store, count=320, kills=12, keys=16,
                 server=("--receive-together", "16"))
    with psycopg2.connect(server_app) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*), COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM delivered "
                    "GROUP BY xact HAVING count(*) > 1) AS together")
        batches, largest = cur.fetchone()
    assert batches >= 1 and largest >= 2, (batches, largest)
