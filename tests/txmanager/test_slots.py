"""Node slots: unique, stable node names for the processes of one service (txmanager.slots)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from txmanager.postgres import PostgresXAResource
from txmanager.slots import NodeSlots, NoFreeSlotError

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


class Holder:
    """A slot_holder child process."""

    def __init__(self, directory: Path, *dsns: str) -> None:
        self.child = subprocess.Popen([sys.executable, "-m", "tests.txmanager.slot_holder", str(directory), *dsns],
                                      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.child.stdout.readline()
        assert line.startswith("SLOT "), (line, self.child.stderr.read() if self.child.poll() is not None else "")
        self.node = line.split()[1]

    def wait_for(self, word: str) -> None:
        line = self.child.stdout.readline()
        assert line.strip() == word, line

    def kill(self) -> None:
        self.child.send_signal(signal.SIGKILL)
        self.child.wait(timeout=30)
        for pipe in (self.child.stdout, self.child.stderr):
            pipe.close()


def test_processes_get_distinct_slots_and_a_dead_ones_slot_is_taken_back(tmp_path: Path) -> None:
    first, second = Holder(tmp_path), Holder(tmp_path)
    try:
        assert sorted([first.node, second.node]) == ["node-0", "node-1"]
        first.kill()
        # the kernel released the dead process's lock: its name and log are free again
        tm = NodeSlots(tmp_path, "node").claim()
        try:
            assert tm.node == first.node
            assert sorted(p.name for p in tmp_path.glob("*.log")) == ["node-0.log", "node-1.log"]
        finally:
            tm.close()
    finally:
        for holder in (first, second):
            if holder.child.poll() is None:
                holder.kill()


def test_a_bounded_set_of_slots_says_when_all_are_held(tmp_path: Path) -> None:
    slots = NodeSlots(tmp_path, "node", size=1)
    tm = slots.claim()
    try:
        with pytest.raises(NoFreeSlotError, match="held by live processes"):
            slots.claim(timeout=0.3)
    finally:
        tm.close()


def test_unbounded_slots_timing_out_before_a_new_slot_say_so(tmp_path: Path) -> None:
    """Without a size, a timeout shorter than new_slot_after once raised TypeError (None - 1)."""
    slots = NodeSlots(tmp_path, "node")
    tm = slots.claim()
    try:
        with pytest.raises(NoFreeSlotError, match="held by live processes"):
            slots.claim(timeout=0.2, new_slot_after=30.0)
    finally:
        tm.close()


def test_a_missing_slot_directory_is_an_error_not_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        NodeSlots(tmp_path / "nope", "node")
    assert not (tmp_path / "nope").exists()


@pytest.mark.postgres
def test_an_orphan_slots_prepared_and_logged_transaction_is_committed_by_another_process(
        pg_dsn_factory, tmp_path: Path) -> None:
    dsns = [pg_dsn_factory("slot_a", "CREATE TABLE t (v text)"), pg_dsn_factory("slot_b", "CREATE TABLE t (v text)")]
    holder = Holder(tmp_path, *dsns)
    holder.wait_for("HELD")
    holder.kill()  # both branches prepared, the decision logged, the process gone

    slots = NodeSlots(tmp_path, "node")
    resources = [PostgresXAResource(dsn) for dsn in dsns]
    try:
        assert all(r.recover() for r in resources)  # in doubt in both databases
        # within the grace period the slot is left to a process that would take it back
        assert slots.recover_orphans(resources, grace=60.0) == {}
        reports = slots.recover_orphans(resources)
        assert len(reports[holder.node].committed) == 2
        assert all(r.recover() == [] for r in resources)
    finally:
        for r in resources:
            r.close()
    for dsn in dsns:
        conn = psycopg2.connect(dsn)
        with conn.cursor() as cur:
            cur.execute("SELECT v FROM t")
            assert cur.fetchall() == [(holder.node,)]
        conn.close()
