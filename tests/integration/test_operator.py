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
    rows = [line for line in listing.splitlines() if line.startswith("InDoubt") and "op-node" in line]
    assert len(rows) == 2 and all("none" in row for row in rows), listing

    assert "waiting=2" in wsrm_recover(log_path, dsns, "--auto")  # default 60 s: too young
    assert len(audit(*dsns, TOTAL).prepared_left) == 2

    assert "rolled_back=2" in wsrm_recover(log_path, dsns, "--auto", "--safety-interval", "0")
    report = audit(*dsns, TOTAL)
    assert report.ok and "o-1" not in report.transfers_a
    assert wsrm_recover(log_path, dsns).strip().splitlines()[-1] == "no in-doubt transactions"


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


def _flip_pending_commit_record(log_path: str) -> None:
    """Damage the one commit record that is still pending (the killed transfer's)."""
    import json
    import struct
    with open(log_path, "rb") as f:
        data = bytearray(f.read())
    off, spans, done = 11, {}, set()
    while off + 12 <= len(data) and data[off:off + 4] == b"\xf7TxR":
        (length,) = struct.unpack_from(">I", data, off + 4)
        rec = json.loads(bytes(data[off + 12:off + 12 + length]))
        if rec["t"] == "commit":
            spans[rec["g"]] = (off, off + 12 + length)
        elif rec["t"] == "done":
            done.add(rec["g"])
        off += 12 + length
    (lo, hi), = [span for g, span in spans.items() if g not in done]
    data[(lo + hi) // 2] ^= 0x20
    with open(log_path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("crashed", ["logged"], indirect=True)
def test_a_damaged_log_holds_the_branches_and_the_operator_resolves_them(crashed):
    """The decision of the killed transfer is unreadable: --auto does NOT presume it
    aborted (that could undo half of a committed transfer); the listing says
    "unknown"; the operator commits both branches and ends safe mode."""
    log_path, dsns = crashed
    _flip_pending_commit_record(log_path)
    auto = wsrm_recover(log_path, dsns, "--auto", "--safety-interval", "0")
    assert "SAFE MODE" in auto and "held=2" in auto and "rolled_back" not in auto, auto
    gids = audit(*dsns, TOTAL).prepared_left
    assert len(gids) == 2, "nothing was presumed aborted"
    listing = wsrm_recover(log_path, dsns)
    assert listing.count("unknown (recovery log damaged") == 2, listing
    dsn_args = [arg for d in dsns for arg in ("--dsn", d)]
    refused = subprocess.run([WSRM, "recover", "--log", log_path, "--end-safe-mode", *dsn_args],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 1 and "safe mode NOT ended" in refused.stderr
    for gid in gids:
        assert "committed" in wsrm_recover(log_path, dsns, "--commit", gid)
    assert "safe mode ended" in wsrm_recover(log_path, dsns, "--end-safe-mode")
    report = audit(*dsns, TOTAL)
    assert report.ok and "o-1" in report.transfers_a and "o-1" in report.transfers_b
    assert "SAFE MODE" not in wsrm_recover(log_path, dsns)
