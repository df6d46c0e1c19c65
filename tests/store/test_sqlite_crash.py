"""The SQLite store's prepared branches survive kill -9 and are finished by recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from txmanager import TransactionManager
from txmanager.xid import Xid
from wsrm_plugin.store import InDoubtBranchesError, LockTimeoutError
from wsrm_plugin.store.sqlite import SqliteStore

from .test_managers import enqueue, new_rms

CHILD = textwrap.dedent("""
    import sys, time
    from txmanager.xid import Xid
    from wsrm_plugin.store.sqlite import SqliteStore

    store = SqliteStore(sys.argv[1], lock_timeout=30)
    xa = store.xa_resource()
    xid = Xid.new_global("crashtest").branch("0")
    xa.start(xid)
    tx = xa.transaction_of(xid)
    tx.rmd.create("in-1", acks_to="http://c/acks", rm_version="1.1", wsa_version="w")
    tx.rmd.record_received("in-1", 1)
    tx.invoker.put("in-1", 1, b"<incoming/>", action="urn:op", soap_version="1.2")
    tx.rms_messages.enqueue("k1", b"<second/>", action="urn:op", soap_version="1.2",
                            message_id="urn:m2")
    print("ACTIVE", flush=True)
    sys.stdin.readline()
    xa.end(xid)
    assert xa.prepare(xid) == 0
    print("PREPARED", xid.to_text(), flush=True)
    time.sleep(600)
""")


def _line(proc: subprocess.Popen[str]) -> str:
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        raise AssertionError(f"child died early: {proc.stderr.read()}")
    return line.strip()


@pytest.mark.parametrize("outcome", ["commit", "rollback", "presumed-abort"])
def test_prepared_branch_survives_kill_and_recovery_finishes_it(tmp_path: Path, outcome: str) -> None:
    path = tmp_path / "store.db"
    with SqliteStore(path) as store:
        with store.begin() as tx:
            new_rms(tx)
            enqueue(tx, n=1)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert _line(child) == "ACTIVE"
        other = SqliteStore(path, lock_timeout=0.3)  # opening does not wait for the child
        with pytest.raises(LockTimeoutError, match="another process"):
            other.begin()                            # its active branch holds the file

        child.stdin.write("go\n")
        child.stdin.flush()
        word, text = _line(child).split()
        assert word == "PREPARED"
        xid = Xid.from_text(text)
        with pytest.raises(InDoubtBranchesError) as in_doubt:
            other.begin()                            # prepared, undecided: still refused
        assert in_doubt.value.xids == (xid,)
        assert other.status().prepared_branches == 1
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        child.stderr.close()
        child.stdin.close()
    assert child.returncode == -signal.SIGKILL

    store = SqliteStore(path, lock_timeout=0.3)
    xa = store.xa_resource()
    assert xa.recover() == [xid]
    assert xa.prepared_age(xid) >= 0
    with pytest.raises(InDoubtBranchesError):
        store.begin()                                # the dead child's branch still holds it

    if outcome == "commit":
        xa.commit(xid, one_phase=False)
    elif outcome == "rollback":
        xa.rollback(xid)
    else:  # the TM never logged a decision: its recovery presumes abort
        tm = TransactionManager(node="crashtest", log=tmp_path / "tm.log", safety_interval=0)
        try:
            tm.register_resource(xa)
            tm.recovery.recover_once()
        finally:
            tm.close()

    assert xa.recover() == []
    store.lock_timeout = 10
    with store.begin() as tx:
        committed = outcome == "commit"
        rmd = tx.rmd.get("in-1")
        assert (rmd is not None) == committed
        if committed:
            assert rmd.received.ranges == ((1, 1),)
        assert tx.invoker.count("in-1") == (1 if committed else 0)
        assert [m.number for m in tx.rms_messages.list_for("k1")] == ([1, 2] if committed else [1])
        assert enqueue(tx, n=1)[0].number == (3 if committed else 2)
    assert store.status().prepared_branches == 0
