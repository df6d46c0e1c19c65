"""Node names claimed in PostgreSQL, decisions kept there, the fence, and the takeover of a dead holder's node.

Each "host" here is a :class:`PostgresNodes` of its own in this process (its
own lease session); a host dies when the server ends its lease session
(``pg_terminate_backend``), which is what a killed process's kernel closing
the socket, or the server's keepalive, does.
"""

from __future__ import annotations

import time

import psycopg2
import pytest

from txmanager import RollbackError
from txmanager.dblog import DatabaseLog
from txmanager.lease import FENCED, LeaseSession, Timing, seize, try_lock
from txmanager.nodes import NoFreeNodeError, PostgresNodes
from txmanager.postgres import XADataSource
from txmanager.xid import Xid


class _Died(BaseException):
    """Raised by the checkpoint: the process stops there, as if killed (no clean-up at all)."""


def _die_at(point: str):
    def checkpoint(at: str, index: int) -> None:
        if at == point:
            raise _Died(at)
    return checkpoint


def _run(dsn: str, sql: str, params: tuple = ()) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def _kill_host(dsn: str, nodes: PostgresNodes) -> None:
    """End the host's lease session, and wait until its backend is gone (ending is asynchronous)."""
    assert nodes.session is not None
    pid = nodes.session.backend_pid
    _run(dsn, "SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 30
    while _run(dsn, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)):
        assert time.monotonic() < deadline, f"backend {pid} did not end"
        time.sleep(0.02)


@pytest.fixture
def dbs(pg_dsn_factory):
    store, app = pg_dsn_factory("store"), pg_dsn_factory("app")
    _run(app, "CREATE TABLE t (v int PRIMARY KEY)")
    return store, app


@pytest.fixture
def hosts():
    made: list[tuple[PostgresNodes, list]] = []

    def make(store: str, app: str, **tm_options):
        nodes = PostgresNodes(store, "svc", takeover_within=3, tag_sessions=False)
        tm = nodes.claim(**tm_options)
        sources = [XADataSource(app, tm), XADataSource(store, tm, commit_marks=True)]
        made.append((nodes, [*sources, tm]))
        return nodes, tm, sources

    yield make
    for nodes, closing in made:
        for thing in closing:
            thing.close()
        nodes.close()


def _transfer(tm, sources, value: int) -> None:
    app_ds, store_ds = sources
    with tm.transaction():
        with app_ds.connection() as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (%s)", (value,))
        with store_ds.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT 1")  # the store branch: it carries the commit mark


def _dies(tm, sources, value: int) -> None:
    with pytest.raises(_Died):
        _transfer(tm, sources, value)
    tm._local.tx = None  # the "dead" thread's binding


def _prepared(dsn: str) -> list[str]:
    return [gid for (gid,) in _run(dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")]


def test_hosts_claim_the_lowest_free_name_and_a_restarted_host_gets_one_again(dbs, hosts):
    store, app = dbs
    a, _, _ = hosts(store, app)
    b, _, _ = hosts(store, app)
    assert (a.node, b.node) == ("svc-0", "svc-1")
    first_epoch = a.claim_.epoch
    _kill_host(store, a)
    c, _, _ = hosts(store, app)
    assert c.node == "svc-0" and c.claim_.epoch > first_epoch
    assert _run(store, "SELECT count(*) FROM txm_node")[0][0] == 2


def test_size_bounds_the_names(dbs):
    store, _ = dbs
    a = PostgresNodes(store, "one", size=1, takeover_within=3, tag_sessions=False)
    a.claim()
    b = PostgresNodes(store, "one", size=1, takeover_within=3, tag_sessions=False)
    try:
        with pytest.raises(NoFreeNodeError, match="raise the size"):
            b.claim(timeout=0.5)
    finally:
        a.close()
        b.close()


def test_takeover_commits_what_was_decided_and_rolls_back_the_rest(dbs, hosts):
    store, app = dbs
    a, tma, sources_a = hosts(store, app)
    _transfer(tma, sources_a, 1)  # a normal commit: the store is noted as a keeper of marks
    tma._checkpoint = _die_at("prepared")
    _dies(tma, sources_a, 2)      # app branch prepared, no mark: to be rolled back
    tma._checkpoint = _die_at("logged")
    _dies(tma, sources_a, 3)      # the mark committed: the prepared app branch must be committed
    assert len(_prepared(app)) == 2
    b, tmb, _ = hosts(store, app)
    assert b.take_over_free(tmb._resources) == {}  # a's name is held: nothing to take over
    _kill_host(store, a)
    reports = b.take_over_free(tmb._resources)
    assert set(reports) == {"svc-0"}
    assert len(reports["svc-0"].committed) == 1 and len(reports["svc-0"].rolled_back) == 1
    assert _prepared(app) == []
    assert sorted(v for (v,) in _run(app, "SELECT v FROM t")) == [1, 3]
    assert _run(store, "SELECT count(*) FROM txm_commit_mark WHERE node = 'svc-0'")[0][0] == 0
    # settled: the next passes over the free name only read (no new epoch, no write)
    settled = _run(store, "SELECT epoch, holder FROM txm_node WHERE name = 'svc-0'")
    assert settled[0][1] is None
    assert set(b.take_over_free(tmb._resources)) == {"svc-0"}
    assert _run(store, "SELECT epoch, holder FROM txm_node WHERE name = 'svc-0'") == settled
    # the name is free again: a host starting now claims it
    assert try_lock(b.session, "svc-0", create=False) is not None


def test_a_host_that_lost_its_claim_decides_nothing_any_more(dbs, hosts):
    store, app = dbs
    a, tma, sources_a = hosts(store, app)
    _transfer(tma, sources_a, 1)
    b, tmb, _ = hosts(store, app)
    _kill_host(store, a)
    b.take_over_free(tmb._resources)
    # a's data sessions still work, but its commit mark fails the fence: all rolled back
    with pytest.raises(RollbackError) as caught:
        _transfer(tma, sources_a, 2)
    assert FENCED in repr(caught.value.__cause__) or "taken over" in str(caught.value.__cause__)
    assert _prepared(app) == []
    assert [v for (v,) in _run(app, "SELECT v FROM t")] == [1]
    # and it cannot write a decision to its log: the claim's session is gone
    gxid = Xid.new_global("svc-0")
    with pytest.raises(Exception, match="lease session|taken over"):
        tma.log.log_commit_decision(gxid, [(gxid.branch(b"0"), "pg:x")])


def test_a_live_session_of_the_old_epoch_fails_the_fence(dbs):
    """The fence holds even for a process whose lease session still works (a pooler, a bug): the epoch decides."""
    store, _ = dbs
    timing = Timing(3)
    old, new = LeaseSession(store, timing), LeaseSession(store, timing)
    try:
        node_id = try_lock(old, "f-0", create=True)
        claim_old = seize(old, "f-0", node_id, "db")
        log_old = DatabaseLog(claim_old)
        gxid = Xid.new_global("f-0")
        log_old.log_commit_decision(gxid, [(gxid.branch(b"0"), "pg:x")])
        old.run(lambda cur: cur.execute("SELECT pg_advisory_unlock_all()"))
        assert try_lock(new, "f-0", create=False) == node_id
        claim_new = seize(new, "f-0", node_id, "db")
        log_new = DatabaseLog(claim_new)
        assert set(log_new.pending()) == {gxid}  # the decision of the previous holder is read
        with pytest.raises(Exception, match="taken over"):
            log_old.log_commit_decision(Xid.new_global("f-0"), [])
        log_new.log_done(gxid)
        assert log_new.pending() == {}
    finally:
        old.close()
        new.close()


def test_timing_is_derived_from_the_bound():
    timing = Timing(10)
    assert timing.dead_after <= 0.7 * 10 and timing.watch_interval == 1.0
    assert "tcp_user_timeout=6000" in timing.connect_kwargs()["options"]
    with pytest.raises(ValueError, match=">= 3 seconds"):
        Timing(2)


def test_a_copy_of_the_decisions_in_a_file_log_beside_the_database(dbs, tmp_path):
    store, _ = dbs
    nodes = PostgresNodes(store, "copy", takeover_within=3, tag_sessions=False)
    tm = nodes.claim(log_copy=tmp_path / "{node}.log")
    try:
        gxid = Xid.new_global(tm.node)
        tm.log.log_commit_decision(gxid, [(gxid.branch(b"0"), "pg:x")])
        assert set(tm.log.copy.pending()) == {gxid} == set(tm.log.pending())
        assert (tmp_path / "copy-0.log").exists()
        assert _run(store, "SELECT node FROM txm_decision WHERE kind = 'commit'") == [("copy-0",)]
        tm.log.log_done(gxid)
        assert tm.log.copy.pending() == {} == tm.log.pending()
    finally:
        tm.close()
        tm.log.close()
        nodes.close()


def test_the_health_check_fails_once_the_node_is_lost(dbs, hosts):
    from types import SimpleNamespace

    from wsrm_plugin.engine import RMPolicy
    from wsrm_plugin.health import NodeHealth

    store, app = dbs
    a, tma, _ = hosts(store, app)
    health = NodeHealth(SimpleNamespace(tm=tma, started=False, workers=[], policy=RMPolicy()), lambda: True)
    assert {c.name: c.status for c in health.liveness().checks} == {"workers": "pass", "node": "pass"}
    _kill_host(store, a)
    assert not a.session.alive()  # what the heartbeat does every watch interval
    node = {c.name: c for c in health.liveness().checks}["node"]
    assert node.status == "fail" and "restart" in node.output and not a.healthy


def test_a_takeover_waits_for_a_decision_in_flight_and_then_fences_the_next(dbs):
    import threading

    store, _ = dbs
    timing = Timing(3)
    old, new = LeaseSession(store, timing), LeaseSession(store, timing)
    data = psycopg2.connect(store)  # a session of the old holder, deciding
    try:
        node_id = try_lock(old, "w-0", create=True)
        claim = seize(old, "w-0", node_id, "db")
        old.close()  # the old holder's claim is gone; its data session is not
        with data.cursor() as cur:
            cur.execute("SELECT txm_fence(%s, %s)", ("w-0", claim.epoch))  # a decision in flight
        # the server releases the closed session's lock when its backend has exited, a moment later
        deadline = time.monotonic() + 30
        while (got := try_lock(new, "w-0", create=False)) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got == node_id
        taken: list = []
        thread = threading.Thread(target=lambda: taken.append(seize(new, "w-0", node_id, "db")))
        thread.start()
        waiting = ("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = %s")
        deadline = time.monotonic() + 30
        while not _run(store, waiting, (new.backend_pid,)):  # the takeover waits for the decision
            assert time.monotonic() < deadline and thread.is_alive(), taken
            time.sleep(0.02)
        data.commit()  # the decision commits: recovery will find it
        thread.join(30)
        assert taken and taken[0].epoch == claim.epoch + 1
        with pytest.raises(psycopg2.Error) as refused, data.cursor() as cur:
            cur.execute("SELECT txm_fence(%s, %s)", ("w-0", claim.epoch))
        assert refused.value.pgcode == FENCED
    finally:
        data.close()
        new.close()


def test_wsrm_nodes_lists_who_holds_what(dbs, hosts, capsys):
    from wsrm_plugin.cli import main

    store, app = dbs
    a, tma, sources_a = hosts(store, app)
    b, _, _ = hosts(store, app)
    tma._checkpoint = _die_at("prepared")
    _dies(tma, sources_a, 5)
    _kill_host(store, a)
    assert main(["nodes", "--dsn", store, "--prefix", "svc"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NODE", "EPOCH", "HELD"]
    svc0, svc1 = (line.split() for line in lines[1:])
    assert svc0[:3] == ["svc-0", "1", "free"] and svc0[-1] == "1"  # its prepared branch, in doubt until taken over
    assert svc1[:3] == ["svc-1", "1", "yes"]


def test_takeover_listeners_hear_each_dead_holders_node_once_and_a_failing_one_stops_nothing(dbs, hosts):
    store, app = dbs
    a, tma, _ = hosts(store, app)
    b, tmb, _ = hosts(store, app)
    assert PostgresNodes.of(tma) is a and PostgresNodes.of(tmb) is b and PostgresNodes.of(object()) is None
    heard: list[str] = []

    def broken(node: str) -> None:
        raise RuntimeError("a listener that fails")

    b.add_takeover_listener(broken)
    b.add_takeover_listener(heard.append)
    assert b.take_over_free(tmb._resources) == {} and heard == []  # a is alive
    _kill_host(store, a)
    assert set(b.take_over_free(tmb._resources)) == {"svc-0"}
    assert heard == ["svc-0"]
    b.take_over_free(tmb._resources)  # settled: the name stays free, nobody died again
    assert heard == ["svc-0"]
    b.remove_takeover_listener(heard.append)
    b.remove_takeover_listener(heard.append)  # twice: nothing to remove, no error
