"""SQLite group commit: concurrent commits share the WAL's fsync, and none returns before one ran.

Real threads committing real transactions on a real file; the store counts its
own fsyncs and the commits that needed one.  Without group commit every commit
fsyncs (SQLite's synchronous=FULL): syncs == commits.
"""

from __future__ import annotations

import os
import threading
import time

from wsrm_plugin.store.sqlite import SqliteStore

THREADS, EACH = 8, 25


def test_concurrent_commits_share_fsyncs_and_each_returns_after_its_fsync(tmp_path, monkeypatch):
    store = SqliteStore(tmp_path / "group.db")
    try:
        with store.begin() as tx:
            tx.write("CREATE TABLE received (item TEXT PRIMARY KEY)")
        sync = store._sync
        name = "fdatasync" if hasattr(os, "fdatasync") else "fsync"  # the store's sync, see _sync_data
        real_fsync = getattr(os, name)
        state = {"fsynced_through": 0}
        late: list[str] = []
        lock = threading.Lock()

        def counted_fsync(fd: int) -> None:
            with sync._cond:
                committed = sync._committed  # every commit numbered so far is in the WAL
            real_fsync(fd)
            with lock:
                state["fsynced_through"] = max(state["fsynced_through"], committed)

        monkeypatch.setattr(os, name, counted_fsync)
        commits_before, syncs_before = sync.commits, sync.syncs

        def worker(n: int) -> None:
            for i in range(EACH):
                with store.begin() as tx:
                    tx.write("INSERT INTO received (item) VALUES (?)", (f"t{n}-{i}",))
                with sync._cond:
                    mine = sync._committed  # at least this commit's number
                with lock:
                    # an fsync that began after this commit was numbered has finished
                    if state["fsynced_through"] < mine - THREADS:
                        late.append(f"t{n}-{i}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        commits, syncs = sync.commits - commits_before, sync.syncs - syncs_before
        assert commits == THREADS * EACH
        assert syncs < commits, f"{syncs} fsyncs for {commits} concurrent commits: nothing shared"
        assert late == []
        with store.begin() as tx:
            assert tx.one("SELECT COUNT(*) FROM received")[0] == THREADS * EACH
        print(f"{syncs} fsyncs for {commits} commits from {THREADS} threads")
    finally:
        store.close()


def test_a_transaction_that_changed_nothing_does_not_fsync(tmp_path):
    store = SqliteStore(tmp_path / "quiet.db")
    try:
        before = store._sync.syncs
        for _ in range(20):
            with store.begin() as tx:
                tx.one("SELECT COUNT(*) FROM schema_version")
        assert store._sync.syncs == before
        with store.begin() as tx:
            tx.write("CREATE TABLE t (x INTEGER)")
            tx.write("INSERT INTO t VALUES (1)")
        assert store._sync.syncs == before + 1
    finally:
        store.close()


def test_a_commit_not_durable_waits_for_no_fsync_and_the_next_durable_one_covers_it(tmp_path):
    """``begin(durable=False)`` (a send attempt recorded, an acknowledgement applied): its commit
    returns without an fsync of its own, and the next durable commit's fsync makes both durable."""
    store = SqliteStore(tmp_path / "lazy.db")
    try:
        with store.begin() as tx:
            tx.write("CREATE TABLE t (x INTEGER)")
        sync = store._sync
        before = sync.syncs
        with store.begin(durable=False) as tx:
            tx.write("INSERT INTO t VALUES (1)")
        assert sync.syncs == before
        assert sync._synced < sync._committed  # numbered, left for the next sync
        with store.begin(durable=False) as tx:
            tx.write("INSERT INTO t VALUES (2)")
            tx.make_durable()  # a decision nobody may be told of and then have forgotten
        assert sync.syncs == before + 1
        with store.begin(durable=False) as tx:
            tx.write("INSERT INTO t VALUES (3)")
        with store.begin() as tx:
            tx.write("INSERT INTO t VALUES (4)")
        assert sync.syncs == before + 2
        assert sync._synced == sync._committed  # the durable commit's fsync covered the one before
    finally:
        store.close()


_KILLED_AFTER_LAZY_COMMIT = """
import os, signal, sys
from wsrm_plugin.store.sqlite import SqliteStore
store = SqliteStore(sys.argv[1])
with store.begin() as tx:
    tx.write("CREATE TABLE t (x INTEGER)")
with store.begin(durable=False) as tx:
    tx.write("INSERT INTO t VALUES (7)")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_commit_not_durable_survives_a_kill_of_its_process(tmp_path):
    """Only a power loss may forget it: the commit is in the WAL, which the kernel keeps."""
    import subprocess
    import sys

    path = tmp_path / "killed.db"
    done = subprocess.run([sys.executable, "-c", _KILLED_AFTER_LAZY_COMMIT, str(path)], timeout=60)
    assert done.returncode == -9
    store = SqliteStore(path)
    try:
        with store.begin() as tx:
            assert tx.one("SELECT x FROM t")[0] == 7
    finally:
        store.close()


def test_what_a_transaction_read_is_on_disk_before_its_commit_returns(tmp_path, monkeypatch):
    """A message sent, an acknowledgement, a reply handed out: what a transaction read leaves the
    process once it returns, so it must not be a commit whose fsync is still under way (another
    thread's, which a power loss would take back: the message sent, then forgotten, and its
    number given to another message the peer then drops as a duplicate).  A commit begun with
    ``durable=False`` is not waited for: it is bookkeeping a power loss may forget."""
    store = SqliteStore(tmp_path / "visible.db")
    try:
        with store.begin() as tx:
            tx.write("CREATE TABLE t (x INTEGER)")
        sync = store._sync
        real_fsync = sync._fsync
        in_fsync, release = threading.Event(), threading.Event()

        def slow_fsync() -> None:
            in_fsync.set()
            assert release.wait(30)
            real_fsync()

        monkeypatch.setattr(sync, "_fsync", slow_fsync)
        writer = threading.Thread(target=lambda: _insert(store, 1))
        writer.start()
        assert in_fsync.wait(30)  # committed, its fsync under way
        read: list[int] = []
        reader = threading.Thread(target=lambda: read.append(_read(store)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and read == []  # read it, and waits for its fsync before returning
        release.set()
        reader.join(30)
        writer.join(30)
        assert read == [1]

        monkeypatch.setattr(sync, "_fsync", real_fsync)
        before = sync.syncs
        with store.begin(durable=False) as tx:
            tx.write("INSERT INTO t VALUES (2)")
        assert _read(store) == 2  # a commit not durable is not waited for
        assert sync.syncs == before
    finally:
        store.close()


def _insert(store: SqliteStore, x: int) -> None:
    with store.begin() as tx:
        tx.write("INSERT INTO t VALUES (?)", (x,))


def _read(store: SqliteStore) -> int:
    with store.begin() as tx:
        return int(tx.one("SELECT COUNT(*) FROM t")[0])


def test_a_commit_that_waits_for_the_disk_later_returns_first_and_its_readers_wait(tmp_path, monkeypatch):
    """``wait_for_disk_later()`` (a receive that buffers a message and then delivers it in a
    commit of its own, which covers this one): the commit returns while its fsync has not run,
    but a transaction that reads it (a duplicate, acknowledged) returns only once it is on
    disk, and ``wait_for_disk()`` waits for it after all."""
    store = SqliteStore(tmp_path / "later.db")
    try:
        with store.begin() as tx:
            tx.write("CREATE TABLE t (x INTEGER)")
        sync = store._sync
        real_fsync = sync._fsync
        release = threading.Event()

        def held_fsync() -> None:
            assert release.wait(30)
            real_fsync()

        monkeypatch.setattr(sync, "_fsync", held_fsync)
        with store.begin() as buffered:
            buffered.wait_for_disk_later()
            buffered.write("INSERT INTO t VALUES (1)")
        assert sync._synced < sync._committed == sync.needed  # returned unsynced, counted as durable
        read: list[int] = []
        reader = threading.Thread(target=lambda: read.append(_read(store)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and read == []  # read it: waits for its fsync
        waiter = threading.Thread(target=buffered.wait_for_disk)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()
        release.set()
        reader.join(30)
        waiter.join(30)
        assert read == [1] and not waiter.is_alive()
        assert sync._synced == sync._committed
    finally:
        store.close()


def test_an_fsync_wakes_the_commits_it_covers_and_one_of_the_later_ones(tmp_path, monkeypatch):
    """Commits numbered after a running fsync began wait for the next one: when the running one
    ends, one of them runs it and the others sleep on until it ends (each woken then found its
    commit too late and slept again: a thread switch, and a wait for the interpreter, each)."""
    from wsrm_plugin.store.sqlite import _GroupSync

    sync = _GroupSync(str(tmp_path / "none-wal"))
    in_fsync, release = threading.Event(), threading.Event()
    fsyncs: list[int] = []

    def fsync() -> None:
        fsyncs.append(sync._target)  # the last commit it covers
        if len(fsyncs) == 1:
            in_fsync.set()
            assert release.wait(30)
        else:
            time.sleep(0.2)  # long enough for any other thread woken meanwhile to sleep again

    monkeypatch.setattr(sync, "_fsync", fsync)
    waits = {"n": 0}
    real_wait = threading.Condition.wait

    def counted_wait(self: threading.Condition, timeout: float | None = None) -> bool:
        if self._lock is sync._cond._lock:  # type: ignore[attr-defined]  # the group sync's sleeps only
            waits["n"] += 1  # under that lock: counted in turn
        return real_wait(self, timeout)

    monkeypatch.setattr(threading.Condition, "wait", counted_wait)
    first = sync.note_commit()
    leader = threading.Thread(target=sync.wait_durable, args=(first,))
    leader.start()
    assert in_fsync.wait(30)  # its fsync covers the first commit only
    covered = threading.Thread(target=sync.wait_durable, args=(first,))
    later = [threading.Thread(target=sync.wait_durable, args=(sync.note_commit(),)) for _ in range(3)]
    for t in [covered, *later]:
        t.start()
    for _ in range(3000):
        with sync._cond:
            if waits["n"] == 4:
                break
        time.sleep(0.01)
    assert waits["n"] == 4
    release.set()
    for t in [leader, covered, *later]:
        t.join(30)
        assert not t.is_alive()
    assert fsyncs == [1, 4]  # the second, run by one of the later commits, covered all three
    assert sync._synced == 4
    assert waits["n"] == 4, f"{waits['n'] - 4} threads woken for nothing"
