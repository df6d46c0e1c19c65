"""A damaged recovery log never loses a decision it wrote (issue 10, part 2).

For a log of N decisions: one flipped byte at every position, a record torn in
the middle (the rest of the file kept), the file truncated inside every record
and at every record boundary.  Each time: every decision whose record is intact
is read; the damage switches to safe mode, in which no branch of this node is
presumed aborted; the operator path decides the rest.  Also: format 1 is still
read (and upgraded), and safe mode survives restarts and compactions.
"""

from __future__ import annotations

import json
import logging
import struct
import zlib

import pytest

from txmanager import MemoryResource, RecoveryLog, TransactionManager, Xid
from txmanager.log import MAGIC, MAGIC_V1

from .conftest import Crash, crash_at, work

N = 6


def _log_of_n(path) -> tuple[list[Xid], list[int], bytes]:
    """N decisions (two of them finished by a "done" record), as one process
    leaves them: returns the gxids still pending, every record's start, the bytes."""
    gs = [Xid.new_global("dmg") for _ in range(N)]
    starts: list[int] = []
    with RecoveryLog(path, fsync=False, preallocate=0) as lg:
        for i, g in enumerate(gs):
            starts.append(lg.size())
            lg.log_commit_decision(g, [(g.branch("0"), "a"), (g.branch("1"), "b")])
            if i in (1, 4):
                starts.append(lg.size())
                lg.log_done(g)
        starts.append(lg.size())
    data = path.read_bytes()
    assert starts[-1] == len(data)
    return [g for i, g in enumerate(gs) if i not in (1, 4)], starts, data


def _decisions_in(data: bytes, lo: int, hi: int) -> set[str]:
    """The gtrids whose commit records lie wholly in data[lo:hi] (independent reader)."""
    out, off = set(), lo
    while off + 12 <= hi:
        (length,) = struct.unpack_from(">I", data, off + 4)
        if off + 12 + length > hi:
            break
        rec = json.loads(data[off + 12:off + 12 + length])
        if rec["t"] == "commit":
            out.add(rec["g"])
        elif rec["t"] == "done":
            out.discard(rec["g"])
        off += 12 + length
    return out


def _open(path) -> tuple[set[str], list[str]]:
    with RecoveryLog(path, fsync=False) as lg:
        return {g.to_text() for g in lg.pending()}, lg.damaged()


def test_one_flipped_byte_anywhere_loses_no_intact_decision(tmp_path):
    path = tmp_path / "src.log"
    pending, starts, data = _log_of_n(path)
    assert len(pending) == 4
    records = list(zip(starts, starts[1:]))
    # In every record: its marker, length, checksum, the first, a middle and the last
    # payload byte (a CRC-32 catches any single damaged byte, wherever it is).
    positions = [p for lo, hi in records
                 for p in (lo, lo + 5, lo + 10, lo + 12, (lo + 12 + hi) // 2, hi - 1)]
    checked = 0
    for pos in positions:
        bad = bytearray(data)
        bad[pos] ^= 0x5A
        target = tmp_path / "flip.log"
        target.write_bytes(bytes(bad))
        for leftover in tmp_path.glob("flip.log.damaged-*"):
            leftover.unlink()
        got, damage = _open(target)
        lo, hi = next((a, b) for a, b in records if a <= pos < b)
        intact = _decisions_in(data, len(MAGIC), lo) | _decisions_in(data, hi, len(data))
        # A flipped "done" record may bring its decision back: harmless (recovery
        # re-commits and hears "no such branch"); losing one is not.
        assert intact <= got, f"flip at {pos}: lost {intact - got}"
        assert got <= {g.to_text() for g in pending} | _decisions_in(data, len(MAGIC), len(data)) \
            | _all_commits(data)
        assert damage, f"flip at {pos} went unnoticed"
        again, damage2 = _open(target)
        assert again == got and damage2, "a restart keeps the decisions and safe mode"
        checked += 1
    assert checked == 6 * len(records) == 48


def _all_commits(data: bytes) -> set[str]:
    out, off = set(), len(MAGIC)
    while off + 12 <= len(data):
        (length,) = struct.unpack_from(">I", data, off + 4)
        rec = json.loads(data[off + 12:off + 12 + length])
        if rec["t"] == "commit":
            out.add(rec["g"])
        off += 12 + length
    return out


@pytest.mark.parametrize("how", ["boundary", "inside", "hole"])
def test_truncation_at_every_record_keeps_every_intact_decision(tmp_path, how):
    """``boundary``: the file cut where record k starts (what is left is a clean,
    shorter log: nothing to detect, nothing intact lost); ``inside``: cut in the
    middle of record k (the tail); ``hole``: the second half of record k cut out
    and the rest of the file kept (the middle)."""
    path = tmp_path / "src.log"
    _, starts, data = _log_of_n(path)
    for k, (lo, hi) in enumerate(zip(starts, starts[1:])):
        mid = (lo + hi) // 2
        image = {"boundary": data[:lo], "inside": data[:mid],
                 "hole": data[:mid] + data[hi:]}[how]
        target = tmp_path / f"{how}-{k}.log"
        target.write_bytes(image)
        got, damage = _open(target)
        intact = _decisions_in(data, len(MAGIC), lo)
        if how == "hole":
            intact |= _decisions_in(data, hi, len(data))
        assert intact <= got, f"record {k}: lost {intact - got}"
        assert bool(damage) == (how != "boundary"), f"record {k}"


@pytest.mark.parametrize("zeros_after", [0, 8192])
def test_a_last_write_cut_at_a_page_boundary_is_an_interrupted_append_not_damage(tmp_path, zeros_after):
    """Linux stops copying a write between two pages when its process is SIGKILLed, so the
    last append of a killed process can end at a page boundary, torn.  That write never
    returned (never synced, never acknowledged): it is dropped, not taken for damage, and
    the log goes on after the last intact record.  Cut anywhere else, it is damage."""
    path = tmp_path / "src.log"
    gs = [Xid.new_global("page") for _ in range(60)]
    starts = []
    with RecoveryLog(path, fsync=False, preallocate=0) as lg:
        for g in gs:
            starts.append(lg.size())
            lg.log_commit_decision(g, [(g.branch("0"), "a"), (g.branch("1"), "b")])
        starts.append(lg.size())
    data = path.read_bytes()
    k = next(i for i, (lo, hi) in enumerate(zip(starts, starts[1:])) if lo < 4096 < hi)
    assert len(data) > 4096 and starts[k] < 4096 < starts[k + 1]  # record k straddles the page
    cut = tmp_path / "cut.log"
    cut.write_bytes(data[:4096] + b"\0" * zeros_after)  # the preallocated zeros follow, or EOF
    got, damage = _open(cut)
    assert damage == [] and got == {g.to_text() for g in gs[:k]}
    later = Xid.new_global("page")
    with RecoveryLog(cut, fsync=False) as lg:  # appends where the torn write began
        lg.log_commit_decision(later, [(later.branch("0"), "a")])
    got, damage = _open(cut)
    assert damage == [] and got == {g.to_text() for g in gs[:k]} | {later.to_text()}
    elsewhere = tmp_path / "elsewhere.log"
    elsewhere.write_bytes(data[:4095])
    got, damage = _open(elsewhere)
    assert damage and {g.to_text() for g in gs[:k]} <= got  # safe mode, nothing intact lost


# -- the transaction manager on a damaged log ---------------------------------------------


def _crashed_decisions(log_path, a, b, n: int) -> list[Xid]:
    """``n`` two-resource transactions, each 'killed' right after its decision was
    logged: every branch is left prepared, every decision is in the log."""
    out = []
    for _ in range(n):
        tm = TransactionManager(node="dmg-node", log=log_path,
                                checkpoint=crash_at("logged"), retry_delay=0.001)
        tx = tm.begin()
        work(tx, a, f"k-{len(out)}", 1)
        work(tx, b, f"k-{len(out)}", 1)
        with pytest.raises(Crash):
            tm.commit()
        tm.close()
        out.append(tx.xid)
    return out


def _record_spans(data: bytes) -> list[tuple[int, int, dict]]:
    out, off = [], len(MAGIC)
    while off + 12 <= len(data):
        (length,) = struct.unpack_from(">I", data, off + 4)
        out.append((off, off + 12 + length, json.loads(data[off + 12:off + 12 + length])))
        off += 12 + length
    return out


@pytest.mark.parametrize("victim", range(4))
def test_safe_mode_presumes_nothing_and_the_operator_decides_the_rest(tmp_path, caplog, victim):
    log_path = tmp_path / "tx.log"
    a, b = MemoryResource("a"), MemoryResource("b")
    gxids = _crashed_decisions(log_path, a, b, 4)
    data = log_path.read_bytes()
    commits = [(lo, hi) for lo, hi, rec in _record_spans(data) if rec["t"] == "commit"]
    assert len(commits) == 4
    lo, hi = commits[victim]
    bad = bytearray(data)
    bad[(lo + hi) // 2] ^= 0x01
    log_path.write_bytes(bytes(bad))

    with caplog.at_level(logging.WARNING):
        tm = TransactionManager(node="dmg-node", log=log_path, safety_interval=0)
    safe_lines = [r for r in caplog.records if "SAFE MODE" in r.getMessage()]
    assert len(safe_lines) == 1 and safe_lines[0].levelno >= logging.WARNING
    try:
        tm.register_resource(a)
        tm.register_resource(b)
        report = tm.recovery.recover_once()
        lost = gxids[victim]
        # The intact decisions are carried out ...
        assert sorted(report.done, key=str) == sorted(
            (g for g in gxids if g != lost), key=str)
        # ... and the branches of the unreadable one are held, not presumed aborted.
        assert report.rolled_back == []
        assert sorted(report.held, key=str) == sorted([lost.branch("0"), lost.branch("1")],
                                                      key=str)
        assert a.store.branch_state(lost.branch("0")) == "prepared"
        assert b.store.branch_state(lost.branch("1")) == "prepared"
        assert not tm.recovery.recover_once().rolled_back, "a second pass holds them too"
        doubts = tm.recovery.in_doubt()
        assert {d.xid for d in doubts} == {lost.branch("0"), lost.branch("1")}
        assert all(d.decision.startswith("unknown") for d in doubts)
        # The operator knows (from the application, or the other branches) it committed.
        for d in doubts:
            assert tm.recovery.resolve(d.xid, commit=True) == "committed"
        assert tm.log.end_safe_mode()
        assert not tm.log.damaged()
    finally:
        tm.close()
    for i in range(4):
        assert a.snapshot()[f"k-{i}"] == b.snapshot()[f"k-{i}"] == 1
    with RecoveryLog(log_path) as lg:
        assert not lg.damaged() and lg.pending() == {}


def test_safe_mode_survives_compaction_and_restart(tmp_path):
    path = tmp_path / "tx.log"
    pending, starts, data = _log_of_n(path)
    bad = bytearray(data)
    bad[starts[0] + 15] ^= 0x10
    path.write_bytes(bytes(bad))
    with RecoveryLog(path, fsync=False) as lg:
        what = lg.damaged()
        assert what
        lg.compact()
        assert lg.damaged() == what
    with RecoveryLog(path, fsync=False) as lg:
        assert lg.damaged() == what
        assert {g.to_text() for g in lg.pending()} == {g.to_text() for g in pending[1:]}


# -- format 1 -----------------------------------------------------------------------------


def _v1_frame(rec: dict) -> bytes:
    payload = json.dumps(rec, separators=(",", ":")).encode()
    length = struct.pack(">I", len(payload))
    return length + struct.pack(">I", zlib.crc32(length + payload)) + payload


def _v1_log(path, gs: list[Xid]) -> list[int]:
    body, starts = bytearray(MAGIC_V1), []
    for g in gs:
        starts.append(len(body))
        body += _v1_frame({"t": "commit", "g": g.to_text(), "b": [[g.branch("0").to_text(), "a"]],
                           "at": 1.0})
    path.write_bytes(bytes(body))
    return starts


def test_a_format_1_log_is_read_and_upgraded(tmp_path):
    path = tmp_path / "old.log"
    gs = [Xid.new_global("old") for _ in range(3)]
    _v1_log(path, gs)
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == set(gs) and not lg.damaged()
        assert lg.format_version == 2
    assert path.read_bytes().startswith(MAGIC)
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == set(gs)


def test_a_damaged_format_1_log_still_yields_every_intact_record(tmp_path):
    path = tmp_path / "old.log"
    gs = [Xid.new_global("old") for _ in range(5)]
    starts = _v1_log(path, gs)
    data = bytearray(path.read_bytes())
    data[starts[1] + 2] ^= 0x7F  # the length of record 1: format 1 used to stop here
    path.write_bytes(bytes(data))
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == set(gs) - {gs[1]}
        assert lg.damaged()
