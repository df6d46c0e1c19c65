"""The recovery log under real faults: concurrent commits sharing fsyncs (group
commit), a process SIGKILLed during compaction, a full disk under the log."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from txmanager import (
    MemoryResource,
    RecoveryLog,
    RollbackError,
    TransactionManager,
    Xid,
)

from .conftest import Crash, crash_at, log_records, work

# -- group commit -------------------------------------------------------------------------


class _GroupingLog(RecoveryLog):
    """A real log whose first flush waits until ``waiters`` more records are queued,
    so the test decides what a batch is instead of hoping the scheduler does."""

    def __init__(self, *args, waiters: int, events: list, **kwargs) -> None:
        self._waiters = waiters
        self._events = events
        self._first = True
        super().__init__(*args, **kwargs)

    def _before_sync(self) -> None:
        if self._first:
            self._first = False
            deadline = time.monotonic() + 30
            while len(self._queue) < self._waiters:
                assert time.monotonic() < deadline, "the other decisions never queued up"
                time.sleep(0.001)
        # What the disk will have once this flush returns: every record written so far.
        self._events.append(("synced", {r["g"] for r in log_records(self.path)}))


def test_concurrent_decisions_share_fsyncs_and_return_only_once_durable(tmp_path):
    n = 8
    events: list = []
    lg = _GroupingLog(tmp_path / "tx.log", waiters=n - 1, events=events)
    start_fsyncs = lg.fsyncs
    gs = [Xid.new_global("group") for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def decide(g: Xid) -> None:
        try:
            barrier.wait()
            lg.log_commit_decision(g, [(g.branch("0"), "a"), (g.branch("1"), "b")])
            events.append(("returned", g.to_text()))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=decide, args=(g,)) for g in gs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors
        syncs = lg.fsyncs - start_fsyncs
        assert syncs < n, f"{syncs} fsyncs for {n} concurrent decisions"
        assert syncs == 2, "the first leader's own flush, then one for the 7 that queued"
        # Each decision returned only after a flush that covered its record.
        durable: set[str] = set()
        for kind, what in events:
            if kind == "synced":
                durable |= what
            else:
                assert what in durable, f"{what} returned before it was flushed"
        assert set(lg.pending()) == set(gs)
    finally:
        lg.close()
    with RecoveryLog(tmp_path / "tx.log") as again:
        assert set(again.pending()) == set(gs)


def test_a_failed_group_write_fails_every_decision_in_it(tmp_path):
    """A real short write (RLIMIT_FSIZE, as a full disk): the whole batch is cut off
    and every caller hears the failure; nothing of the batch is left on disk."""
    import resource

    path = tmp_path / "tx.log"
    lg = RecoveryLog(path, preallocate=0)
    g0 = Xid.new_global("group")
    lg.log_commit_decision(g0, [(g0.branch("0"), "a")])
    size = lg.size()
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    results: dict[str, str] = {}
    gs = [Xid.new_global("group") for _ in range(4)]
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 60, old_limit[1]))

        def decide(g: Xid) -> None:
            try:
                lg.log_commit_decision(g, [(g.branch("0"), "a")])
                results[g.to_text()] = "ok"
            except Exception as e:  # noqa: BLE001
                results[g.to_text()] = type(e).__name__

        threads = [threading.Thread(target=decide, args=(g,)) for g in gs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    ok = {g for g in gs if results[g.to_text()] == "ok"}
    assert set(results.values()) <= {"ok", "RecoveryLogError"}
    assert len(ok) < len(gs), "the limit stopped at least one write"
    assert set(lg.pending()) == {g0} | ok
    lg.close()
    with RecoveryLog(path) as again:
        assert set(again.pending()) == {g0} | ok, "a failed decision never reaches the disk"


# -- SIGKILL during compaction ---------------------------------------------------------------

_WORKER = textwrap.dedent("""
    import sys
    from txmanager import RecoveryLog, Xid
    path, seed = sys.argv[1], int(sys.argv[2])
    lg = RecoveryLog(path, compact_threshold=1024, preallocate=0)
    print("ready", flush=True)
    i = 0
    while True:
        g = Xid.new_global("kill")
        lg.log_commit_decision(g, [(g.branch("0"), "a"), (g.branch("1"), "b")])
        finish = (i + seed) % 4 != 0
        print("C", g.to_text(), int(finish), flush=True)
        if finish:
            lg.log_done(g)
            print("D", g.to_text(), flush=True)
        if i % 3 == 2:
            lg.compact()  # besides the automatic ones: most instants are in a compaction
        i += 1
""")


@pytest.mark.slow
def test_sigkill_at_random_instants_during_compaction_loses_no_decision(tmp_path):
    """A real process decides (and finishes most decisions) as fast as it can, with
    a compaction threshold so small that it compacts every few records, and is
    SIGKILLed at a random instant, 25 times over the same log.  After each kill
    every decision it reported and did not finish is pending, nothing is damaged,
    and the compaction's temporary file is gone."""
    path = tmp_path / "tx.log"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    rng = random.Random(20261125)
    leftovers = 0
    decided: set[str] = set()
    finished: set[str] = set()
    kept: set[str] = set()  # decisions the worker never finishes: pending for ever
    for round_ in range(25):
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(round_)],
                                stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        last = None
        for line in out.splitlines():
            words = line.split()
            if words[:1] == ["C"] and len(words) == 3:
                decided.add(words[1])
                last = words[1]
                if words[2] == "0":
                    kept.add(words[1])
            elif words[:1] == ["D"] and len(words) == 2:
                finished.add(words[1])
        leftovers += len(list(tmp_path.glob("tx.log.compact-*")))
        with RecoveryLog(path) as lg:
            pending = {g.to_text() for g in lg.pending()}
            assert not lg.damaged(), f"round {round_}: {lg.damaged()}"
        # The last decision of a round may have had its "done" written just before
        # the kill, before the worker could say so; every other one is certain.
        lost = (decided - finished - {last}) - pending
        assert not lost, f"round {round_}: decisions lost: {lost}"
        assert not kept - pending, f"round {round_}: unfinished decisions lost"
        assert not list(tmp_path.glob("tx.log.compact-*")), "leftover removed at start"
        assert not pending & finished, "a finished decision came back"
        # The ambiguous last one is settled now: not pending means its "done" made it.
        if last is not None and last not in pending:
            finished.add(last)
    assert len(decided) > 100, "the worker made progress"
    assert leftovers >= 1, "at least one kill landed inside a compaction"
    print(f"{len(decided)} decisions, {len(kept)} kept live, "
          f"{leftovers} kill(s) left a compaction file behind")


# -- a full disk under the log -----------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a 64 KiB tmpfs to fill needs root; run the suite as root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(folder) -> list[str]:
    """Fill the file system until it refuses a byte; returns the fillers' paths."""
    paths = []
    for name, chunk in (("filler", 4096), ("filler2", 1)):
        path = os.path.join(folder, name)
        paths.append(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"x" * chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
    return paths


def test_a_full_disk_rolls_back_undecidable_transactions_and_loses_nothing(small_fs):
    log_path = small_fs / "tx.log"
    a, b = MemoryResource("a"), MemoryResource("b")
    # One decision left pending by a 'crash': it must survive the full disk.
    tm = TransactionManager(node="full", log=log_path, checkpoint=crash_at("logged"),
                            retry_delay=0.001)
    tx = tm.begin()
    work(tx, a, "pending", 1)
    work(tx, b, "pending", 1)
    with pytest.raises(Crash):
        tm.commit()
    pending_gxid = tx.xid
    tm.close()

    tm = TransactionManager(node="full", log=log_path, retry_delay=0.001, safety_interval=0)
    tm.register_resource(a)
    tm.register_resource(b)
    committed, refused = [], []
    try:
        fillers = _fill(small_fs)
        for i in range(200):
            tx = tm.begin()
            work(tx, a, f"k{i}", i)
            work(tx, b, f"k{i}", i)
            try:
                tm.commit()
            except RollbackError as e:
                assert "could not be logged" in str(e)
                refused.append(i)
                break
            committed.append(i)
        assert refused, "the disk filled up"
        print(f"disk full: {len(committed)} committed on the full disk (room left in the "
              f"log's last page), then transaction {refused[0]} refused and rolled back")
        i = refused[0]
        assert f"k{i}" not in a.snapshot() and f"k{i}" not in b.snapshot(), \
            "the transaction whose decision could not be written was rolled back"
        assert set(a.store.branch_xids()) | set(b.store.branch_xids()) == {
            pending_gxid.branch("0"), pending_gxid.branch("1")}, "nothing else left prepared"
        for j in committed:
            assert a.snapshot()[f"k{j}"] == b.snapshot()[f"k{j}"] == j
        assert pending_gxid in tm.log.pending(), "the earlier decision is still known"

        # Space returns: the manager works again, without a restart.
        for path in fillers:
            os.unlink(path)
        with tm.transaction() as tx:
            work(tx, a, "after", 1)
            work(tx, b, "after", 1)
        assert a.snapshot()["after"] == b.snapshot()["after"] == 1
    finally:
        tm.close()
    # Nothing decided was lost: a restart still has the pending decision, and
    # recovery finishes it.
    tm = TransactionManager(node="full", log=log_path, safety_interval=0)
    try:
        tm.register_resource(a)
        tm.register_resource(b)
        assert set(tm.log.pending()) == {pending_gxid}
        assert not tm.log.damaged()
        report = tm.recovery.recover_once()
        assert report.done == [pending_gxid] and report.rolled_back == []
        assert a.snapshot()["pending"] == b.snapshot()["pending"] == 1
    finally:
        tm.close()


def test_concurrent_two_phase_commits_through_the_manager_share_fsyncs(tmp_path):
    """The same through the transaction manager: 8 threads, each a two-resource
    transaction; their 8 decisions take 2 flushes, and every one commits."""
    n = 8
    lg = _GroupingLog(tmp_path / "tx.log", waiters=n - 1, events=[])
    lg._first = False  # the manager's own first record (its node name) is not the test's batch
    tm = TransactionManager(node="group", log=lg, retry_delay=0.001)
    lg._first = True
    pairs = [(MemoryResource(f"a{k}"), MemoryResource(f"b{k}")) for k in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []
    before = lg.fsyncs

    def transfer(k: int) -> None:
        a, b = pairs[k]
        try:
            tx = tm.begin()
            work(tx, a, "k", k)
            work(tx, b, "k", k)
            barrier.wait()
            tm.commit()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=transfer, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors
        assert lg.fsyncs - before == 2, f"{lg.fsyncs - before} fsyncs for {n} decisions"
        for k, (a, b) in enumerate(pairs):
            assert a.snapshot() == b.snapshot() == {"k": k}
        assert tm.log.pending() == {}
    finally:
        tm.close()
        lg.close()
