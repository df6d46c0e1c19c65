"""The SQLite store looks for prepared (in-doubt) XA branches only when one may have been prepared.

Every transaction used to run ``SELECT xid FROM xa_prepared`` after its BEGIN, while it held the
file.  The lock file now carries a mark that a prepare sets (and syncs) before its commit, and a
transaction that looked and found none clears: a transaction that finds it clear does not look.
The rule it stands for must hold across processes and for lock files from before the mark.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from txmanager.xid import Xid
from wsrm_plugin.store import InDoubtBranchesError
from wsrm_plugin.store.sqlite import SqliteStore

from .test_managers import enqueue, new_rms
from .test_sqlite_crash import CHILD, _line


def _looks(store: SqliteStore) -> list[str]:
    """The in-doubt looks SQLite runs on ``store``'s connections from now on (a trace callback on
    each new one; the pool is emptied so that every transaction gets one)."""
    seen: list[str] = []
    connect = store._connect

    def traced() -> sqlite3.Connection:
        conn = connect()
        conn.set_trace_callback(lambda sql: seen.append(sql) if "FROM xa_prepared" in sql else None)
        return conn

    store._connect = traced  # type: ignore[method-assign]
    store.close()
    store._closed = False
    return seen


def _prepare(store: SqliteStore, name: str) -> Xid:
    xa = store.xa_resource()
    xid = Xid.new_global(name).branch("0")
    xa.start(xid)
    enqueue(xa.transaction_of(xid), n=1)
    xa.end(xid)
    assert xa.prepare(xid) == 0
    return xid


def test_only_the_first_transaction_after_a_prepare_looks(tmp_path: Path) -> None:
    """A new store's first transaction looks (its lock file has no mark yet); the ones after do
    not.  Once a branch is prepared every transaction is refused, and after it is finished the
    first looks again, finding none, and the ones after do not."""
    store = SqliteStore(tmp_path / "store.db", lock_timeout=0.3)
    looks = _looks(store)
    with store.begin() as tx:
        new_rms(tx)
    assert len(looks) == 1
    for _ in range(3):
        with store.begin() as tx:
            enqueue(tx, n=1)
    assert len(looks) == 1  # a look for each of them before

    xid = _prepare(store, "look")
    with pytest.raises(InDoubtBranchesError):
        store.begin()
    store.xa_resource().commit(xid, one_phase=False)
    before = len(looks)
    for _ in range(3):
        with store.begin() as tx:
            enqueue(tx, n=1)
    assert len(looks) == before + 1


def test_a_lock_file_from_before_the_mark_makes_the_first_transaction_look(tmp_path: Path) -> None:
    """A store whose prepared branch was written before the mark existed (its lock file empty, as
    such a store left it; made by another process, so that this one has no gate on it yet): the
    first transaction looks, and is refused."""
    path = tmp_path / "store.db"
    made = subprocess.run([sys.executable, "-c", MAKE_OLD, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)
    assert made.returncode == 0, made.stderr
    lock = Path(str(path) + ".lock")
    lock.write_bytes(b"")  # as before the mark
    store = SqliteStore(path, lock_timeout=0.3, create=False)
    looks = _looks(store)
    with pytest.raises(InDoubtBranchesError):
        store.begin()
    assert looks  # (again and again, until lock_timeout)


#: A store with a branch prepared as before the mark (its row alone), made in a process of its own.
MAKE_OLD = """
import sqlite3, sys
from txmanager.xid import Xid
from wsrm_plugin.store.sqlite import SqliteStore
SqliteStore(sys.argv[1]).close()
conn = sqlite3.connect(sys.argv[1])
conn.execute("INSERT INTO xa_prepared (xid, undo, prepared_at) VALUES (?, ?, ?)",
             (Xid.new_global("old").branch("0").to_text(), b"", 0.0))
conn.commit()
conn.close()
"""


def test_a_branch_another_process_prepares_is_seen(tmp_path: Path) -> None:
    """This process looked and found none (the mark clear); another process then prepares a
    branch: this process's next transaction looks, and is refused, until it is finished."""
    path = tmp_path / "store.db"
    store = SqliteStore(path, lock_timeout=0.3)
    with store.begin() as tx:
        new_rms(tx)
    looks = _looks(store)
    with store.begin():
        pass
    assert looks == []  # clear: nobody prepared since the first transaction looked

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert _line(child) == "ACTIVE"
        child.stdin.write("go\n")
        child.stdin.flush()
        word, text = _line(child).split()
        assert word == "PREPARED"
        with pytest.raises(InDoubtBranchesError) as in_doubt:
            store.begin()
        assert in_doubt.value.xids == (Xid.from_text(text),)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        for stream in (child.stdout, child.stderr, child.stdin):
            stream.close()
    store.xa_resource().rollback(Xid.from_text(text))
    with store.begin() as tx:
        assert tx.rms.get("k1") is not None
