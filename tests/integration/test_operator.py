"""``wsrm recover``: what an operator sees and does after a crash, run as the real command."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from wsrm_plugin.tools.bank import audit, create_bank
from wsrm_plugin.tools.txdemo import ACCOUNTS, BALANCE, run_worker
from txmanager.xid import Xid

pytestmark = pytest.mark.postgres
TOTAL = 2 * ACCOUNTS * BALANCE
WSRM = os.path.join(os.path.dirname(sys.executable), "wsrm")


def wsrm_recover(log_path: str, dsns: list[str], *extra: str) -> str:
    cmd = [WSRM, "recover", "--log", log_path, "--node", "op-node", *extra]
    for dsn in dsns:
        cmd += ["--dsn", dsn]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def crashed(pg_server, tmp_path, request):
    """Two banks and a worker SIGKILLed at the kill point given by the test's param."""
    names = [f"op_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for n in names:
        pg_server.create_database(n)
    dsns = [pg_server.dsn(n) for n in names]
    for dsn in dsns:
        create_bank(dsn, ACCOUNTS, BALANCE)
    log_path = str(tmp_path / "tx.log")
    rc = run_worker(*dsns, log_path, transfers=3, prefix="o", kill_at=request.param, kill_tx=1,
                    seed=1, node="op-node")
    assert rc == -9
    return log_path, dsns


@pytest.mark.parametrize("crashed", ["before_log"], indirect=True)
def test_unlogged_branches_are_listed_and_rolled_back_only_after_the_safety_interval(crashed):
    log_path, dsns = crashed
    listing = wsrm_recover(log_path, dsns)
    rows = [line for line in listing.splitlines() if "op-node" in line]
    assert len(rows) == 2 and all("none" in row for row in rows), listing

    assert "waiting=2" in wsrm_recover(log_path, dsns, "--auto")  # default 60 s: too young
    assert len(audit(*dsns, TOTAL).prepared_left) == 2

    assert "rolled_back=2" in wsrm_recover(log_path, dsns, "--auto", "--safety-interval", "0")
    report = audit(*dsns, TOTAL)
    assert report.ok and "o-1" not in report.transfers_a
    assert wsrm_recover(log_path, dsns).strip() == "no in-doubt transactions"


@pytest.mark.parametrize("crashed", ["logged"], indirect=True)
def test_an_operator_can_commit_a_listed_branch_by_hand(crashed):
    log_path, dsns = crashed
    listing = wsrm_recover(log_path, dsns)
    assert listing.count("commit") >= 2, listing
    before = audit(*dsns, TOTAL)
    gids = before.prepared_left
    assert len(gids) == 2
    for gid in gids:
        xid = Xid.from_pg_gid(gid)
        assert xid is not None and xid.node == "op-node"
        assert "committed" in wsrm_recover(log_path, dsns, "--commit", gid)
    report = audit(*dsns, TOTAL)
    assert report.ok and "o-1" in report.transfers_a and "o-1" in report.transfers_b
