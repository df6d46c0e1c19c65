"""The recovery log: meaning of the records, durability format, damaged files,
compaction and the process lock."""

from __future__ import annotations

import logging
import struct
import zlib

import pytest

from txmanager import LogLockedError, MemoryLog, RecoveryLog, RecoveryLogError, Xid
from txmanager.log import MAGIC
from txmanager.xa import XA_HEURHAZ, XA_HEURMIX, XA_HEURRB

from .conftest import log_records


def gxid() -> Xid:
    return Xid.new_global("logtest")


def branches(g: Xid, n: int = 2) -> list[tuple[Xid, str]]:
    return [(g.branch(str(i)), f"res{i}") for i in range(n)]


@pytest.fixture(params=["file", "memory"])
def any_log(request, tmp_path):
    lg = RecoveryLog(tmp_path / "tx.log") if request.param == "file" else MemoryLog()
    yield lg
    lg.close()


# -- meaning ------------------------------------------------------------------------


def test_decision_is_pending_until_done(any_log):
    g = gxid()
    any_log.log_commit_decision(g, branches(g))
    entry = any_log.pending()[g]
    assert entry.committing and entry.branches == tuple(branches(g))
    assert entry.resource_of(g.branch("1")) == "res1"
    assert entry.logged_at is not None
    assert any_log.is_pending(g)
    any_log.log_done(g)
    assert any_log.pending() == {} and not any_log.is_pending(g)


def test_heuristic_outlives_done_until_forget(any_log):
    g = gxid()
    any_log.log_commit_decision(g, branches(g))
    any_log.log_heuristic(g, g.branch("1"), XA_HEURRB, "res1")
    any_log.log_done(g)
    entry = any_log.pending()[g]
    assert not entry.committing and dict(entry.heuristics) == {g.branch("1"): XA_HEURRB}
    any_log.forget(g)
    assert any_log.pending() == {}


def test_heuristic_without_decision_names_its_resource(any_log):
    g = gxid()
    any_log.log_heuristic(g, g.branch("0"), XA_HEURMIX, "res0")
    entry = any_log.pending()[g]
    assert not entry.committing and entry.resource_of(g.branch("0")) == "res0"


def test_bad_arguments_are_refused(any_log):
    g = gxid()
    with pytest.raises(ValueError, match="global xid"):
        any_log.log_commit_decision(g.branch("0"), branches(g))
    with pytest.raises(ValueError, match="XA_HEUR"):
        any_log.log_heuristic(g, g.branch("0"), 0)
    assert any_log.pending() == {}


# -- the file -------------------------------------------------------------------------


def test_round_trip_through_reopen(tmp_path):
    path = tmp_path / "tx.log"
    g1, g2, g3 = gxid(), gxid(), gxid()
    with RecoveryLog(path) as lg:
        lg.log_commit_decision(g1, branches(g1, 3))
        lg.log_commit_decision(g2, branches(g2))
        lg.log_done(g2)
        lg.log_heuristic(g3, g3.branch("0"), XA_HEURHAZ, "res0")
        before = lg.pending()
    with RecoveryLog(path) as lg:
        assert lg.pending() == before
        assert set(before) == {g1, g3}
        assert [r["t"] for r in log_records(path)] == ["commit", "commit", "done", "heur"]


def test_a_second_open_is_locked_out(tmp_path):
    path = tmp_path / "tx.log"
    first = RecoveryLog(path)
    with pytest.raises(LogLockedError, match="in use"):
        RecoveryLog(path)
    first.close()
    RecoveryLog(path).close()


def test_a_file_that_is_not_a_log_is_left_alone(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my precious notes\n" * 10)
    with pytest.raises(RecoveryLogError, match="not a transaction recovery log"):
        RecoveryLog(path)
    assert path.read_bytes() == b"my precious notes\n" * 10


def test_a_torn_header_is_a_new_log(tmp_path):
    path = tmp_path / "tx.log"
    path.write_bytes(MAGIC[:4])
    with RecoveryLog(path) as lg:
        assert lg.pending() == {}
    assert path.read_bytes() == MAGIC


def test_closed_log_refuses_writes(tmp_path):
    lg = RecoveryLog(tmp_path / "tx.log")
    lg.close()
    lg.close()  # idempotent
    with pytest.raises(RecoveryLogError, match="closed"):
        lg.log_done(gxid())


def _three_records(path) -> tuple[list[Xid], list[int]]:
    """Three decisions; returns their gxids and the byte offset where each record starts."""
    gs = [gxid() for _ in range(3)]
    starts = []
    with RecoveryLog(path) as lg:
        for g in gs:
            starts.append(lg.size())
            lg.log_commit_decision(g, branches(g))
    return gs, starts


def test_torn_tail_at_every_byte_keeps_earlier_records_and_is_damage(tmp_path, caplog):
    """A torn last record: every earlier record is kept, and (except for a tail of
    zero bytes, the unused allocation) it is damage: safe mode."""
    path = tmp_path / "tx.log"
    gs, starts = _three_records(path)
    data = path.read_bytes()
    last = starts[2]
    for cut in range(last, len(data)):
        torn = tmp_path / f"torn-{cut}.log"
        torn.write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="txmanager.log"):
            lg = RecoveryLog(torn, fsync=False)
        try:
            assert set(lg.pending()) == set(gs[:2]), f"cut at {cut}"
            damaged = data[last:cut].strip(b"\0") != b""
            assert bool(lg.damaged()) == damaged, f"cut at {cut}"
            assert damaged == any("SAFE MODE" in r.message for r in caplog.records)
            extra = gxid()
            lg.log_commit_decision(extra, branches(extra))
        finally:
            lg.close()
        with RecoveryLog(torn, fsync=False) as again:
            assert set(again.pending()) == {gs[0], gs[1], extra}, f"cut at {cut}"
            assert bool(again.damaged()) == damaged, "safe mode outlives a restart"


@pytest.mark.parametrize("where", ["marker", "payload", "length", "checksum"])
def test_a_flipped_byte_costs_that_record_only(tmp_path, caplog, where):
    """Reading resumes at the next record's marker: the decisions after the bad
    record are kept; the damaged original is kept for an operator; safe mode."""
    path = tmp_path / "tx.log"
    gs, starts = _three_records(path)
    data = bytearray(path.read_bytes())
    pos = {"marker": starts[1] + 1, "length": starts[1] + 6, "checksum": starts[1] + 9,
           "payload": starts[1] + 20}[where]
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="txmanager.log"):
        lg = RecoveryLog(path)
    with lg:
        assert set(lg.pending()) == {gs[0], gs[2]}
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "SAFE MODE" in errors[0].message
        assert f"bytes {starts[1]}-{starts[2]}" in errors[0].message
        saved = list(tmp_path.glob("tx.log.damaged-*"))
        assert len(saved) == 1 and saved[0].read_bytes() == bytes(data)
        g = gxid()
        lg.log_commit_decision(g, branches(g))
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == {gs[0], gs[2], g}
        assert lg.damaged()


def _open_log_image(path, records: int = 3) -> tuple[bytes, list[Xid], int]:
    """The bytes a killed process leaves behind: decisions logged, the log never
    closed (so the room allocated ahead is still there, as zeros)."""
    lg = RecoveryLog(path, preallocate=4096)
    gs = [gxid() for _ in range(records)]
    for g in gs:
        lg.log_commit_decision(g, branches(g))
    image, size = path.read_bytes(), lg.size()
    lg.close()
    return image, gs, size


def test_appends_write_into_room_allocated_ahead(tmp_path):
    path = tmp_path / "tx.log"
    with RecoveryLog(path, preallocate=4096) as lg:
        g = gxid()
        lg.log_commit_decision(g, branches(g))
        allocated = path.stat().st_size
        assert allocated == 4096 > lg.size()
        for _ in range(5):
            g = gxid()
            lg.log_commit_decision(g, branches(g))
            lg.log_done(g)
        assert path.stat().st_size == allocated, "appends inside the allocation keep the size"
        while lg.size() < allocated:
            g = gxid()
            lg.log_commit_decision(g, branches(g))
        assert path.stat().st_size == 2 * 4096, "the next chunk is allocated when needed"
        written = lg.size()
    assert path.stat().st_size == written, "close gives the unused room back"


def test_without_preallocation_the_file_is_exactly_the_records(tmp_path):
    path = tmp_path / "tx.log"
    with RecoveryLog(path, preallocate=0) as lg:
        g = gxid()
        lg.log_commit_decision(g, branches(g))
        assert path.stat().st_size == lg.size()
    with pytest.raises(ValueError, match="preallocate"):
        RecoveryLog(tmp_path / "other.log", preallocate=-1)


def test_unused_allocation_of_a_log_never_closed_is_its_clean_end(tmp_path, caplog):
    path = tmp_path / "tx.log"
    image, gs, size = _open_log_image(path)
    assert len(image) > size and image[size:].count(0) == len(image) - size
    killed = tmp_path / "killed.log"
    killed.write_bytes(image)
    with caplog.at_level(logging.WARNING, logger="txmanager.log"):
        lg = RecoveryLog(killed, preallocate=4096)
    with lg:
        assert set(lg.pending()) == set(gs)
        assert lg.size() == size
        assert not caplog.records, "zeros after the last record are not damage"
        assert not list(tmp_path.glob("*.corrupt-*"))
        g = gxid()
        lg.log_commit_decision(g, branches(g))  # writes over the zeros, in place
    assert log_records(killed)[-1]["g"] == g.to_text()
    with RecoveryLog(killed) as again:
        assert set(again.pending()) == set(gs) | {g}


@pytest.mark.parametrize("damage", ["torn record", "bytes after a gap of zeros"])
def test_damage_inside_the_allocated_room_is_still_found(tmp_path, caplog, damage):
    """A record torn by a crash, followed by the zeros of the allocation; or
    zeros where a record should start, and something after them: both are
    damage (safe mode), the intact records are all kept, the copy is saved
    without the trailing zeros."""
    path = tmp_path / "tx.log"
    image, gs, size = _open_log_image(path)
    extra = gxid()
    frame = bytes(_frame_of(extra))
    if damage == "torn record":
        bad = frame[:len(frame) // 2]
        at = size
        expected = set(gs)
    else:
        bad = frame
        at = size + 100
        expected = set(gs) | {extra}  # an intact record after a hole is read
    killed = bytearray(image)
    killed[at:at + len(bad)] = bad
    path2 = tmp_path / "killed.log"
    path2.write_bytes(bytes(killed))
    with caplog.at_level(logging.WARNING, logger="txmanager.log"):
        lg = RecoveryLog(path2)
    with lg:
        assert set(lg.pending()) == expected
        assert any(f"bytes {size}-" in r.message for r in caplog.records)
        saved = list(tmp_path.glob("killed.log.damaged-*"))
        assert len(saved) == 1 and saved[0].read_bytes() == bytes(killed[:at + len(bad)])
        g = gxid()
        lg.log_commit_decision(g, branches(g))
    with RecoveryLog(path2) as lg:
        assert set(lg.pending()) == expected | {g}
        assert lg.damaged()


def _frame_of(g: Xid) -> bytes:
    """A well-formed commit record of ``g``, framed as the log frames it."""
    import json
    payload = json.dumps({"t": "commit", "g": g.to_text(), "b": [], "at": 1.0},
                         separators=(",", ":")).encode()
    length = struct.pack(">I", len(payload))
    return b"\xf7TxR" + length + struct.pack(">I", zlib.crc32(length + payload)) + payload


def test_records_are_the_json_the_format_documents(tmp_path):
    """The hand-built records are exactly json.dumps of the documented objects."""
    import json
    path = tmp_path / "tx.log"
    g = gxid()
    with RecoveryLog(path) as lg:
        lg.log_commit_decision(g, [(g.branch("0"), 'odd "name" \u00e9'), (g.branch("1"), "r1")])
        lg.log_heuristic(g, g.branch("1"), XA_HEURRB, None)
        lg.log_heuristic(g, g.branch("0"), XA_HEURMIX, "r0")
        lg.log_done(g)
        lg.forget(g)
    data = path.read_bytes()
    off, payloads = len(MAGIC), []
    while off < len(data):
        assert data[off:off + 4] == b"\xf7TxR"
        (length,) = struct.unpack_from(">I", data, off + 4)
        payloads.append(data[off + 12:off + 12 + length])
        off += 12 + length
    records = [json.loads(p) for p in payloads]
    assert [json.dumps(r, separators=(",", ":")).encode() for r in records] == payloads
    assert records[0]["b"] == [[g.branch("0").to_text(), 'odd "name" \u00e9'],
                               [g.branch("1").to_text(), "r1"]]
    assert records[1] == {"t": "heur", "g": g.to_text(), "x": g.branch("1").to_text(),
                          "c": XA_HEURRB, "r": None}
    assert [r["t"] for r in records] == ["commit", "heur", "heur", "done", "forget"]


def test_garbage_after_the_records_is_ignored(tmp_path, caplog):
    path = tmp_path / "tx.log"
    gs, _ = _three_records(path)
    with open(path, "ab") as f:
        f.write(b"\x00\xff garbage \x13" * 7)
    with caplog.at_level(logging.WARNING, logger="txmanager.log"):
        with RecoveryLog(path) as lg:
            assert set(lg.pending()) == set(gs)
            assert lg.damaged()
    assert caplog.records, "the damage is reported"


def test_a_checksummed_but_meaningless_record_also_stops_reading(tmp_path):
    path = tmp_path / "tx.log"
    gs, _ = _three_records(path)
    payload = b'{"t":"nonsense","g":"x"}'
    with open(path, "ab") as f:
        f.write(b"\xf7TxR" + struct.pack(">II", len(payload),
                zlib.crc32(struct.pack(">I", len(payload)) + payload)) + payload)
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == set(gs)
        assert lg.damaged(), "a record that means nothing is not trusted either"


# -- compaction ------------------------------------------------------------------------


def test_compaction_keeps_exactly_the_live_records(tmp_path):
    path = tmp_path / "tx.log"
    with RecoveryLog(path) as lg:
        finished = [gxid() for _ in range(20)]
        for g in finished:
            lg.log_commit_decision(g, branches(g))
            lg.log_done(g)
        live = gxid()
        lg.log_commit_decision(live, branches(live, 3))
        heur = gxid()
        lg.log_commit_decision(heur, branches(heur))
        lg.log_heuristic(heur, heur.branch("1"), XA_HEURRB, "res1")
        lg.log_done(heur)
        forgotten = gxid()
        lg.log_heuristic(forgotten, forgotten.branch("0"), XA_HEURMIX, "res0")
        lg.forget(forgotten)
        before, size = lg.pending(), lg.size()
        lg.compact()
        assert lg.size() < size
        assert lg.pending() == before
        records = log_records(path)
        assert [(r["t"], r["g"]) for r in records] == [
            ("commit", live.to_text()), ("heur", heur.to_text())]
        assert len(path.read_bytes()) == lg.size()
        after = gxid()
        lg.log_commit_decision(after, branches(after))  # appends to the new file
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == {live, heur, after}
        assert lg.pending()[live].branches == tuple(branches(live, 3))
    assert not list(tmp_path.glob("*.compact-*"))


def test_compaction_happens_by_itself_past_the_threshold(tmp_path):
    path = tmp_path / "tx.log"
    with RecoveryLog(path, fsync=False, compact_threshold=4096) as lg:
        keep = gxid()
        lg.log_commit_decision(keep, branches(keep))
        for _ in range(200):
            g = gxid()
            lg.log_commit_decision(g, branches(g))
            lg.log_done(g)
        assert lg.size() <= 2 * 4096
        assert set(lg.pending()) == {keep}
    assert path.stat().st_size <= 2 * 4096
    with RecoveryLog(path) as lg:
        assert set(lg.pending()) == {keep}


def test_a_failed_write_leaves_no_half_record_behind(tmp_path):
    """A real short write: the file-size limit (RLIMIT_FSIZE) stops the write of
    the second decision half-way, as a full disk would."""
    import resource
    import signal

    path = tmp_path / "tx.log"
    lg = RecoveryLog(path)
    g1, g2, g3 = gxid(), gxid(), gxid()
    lg.log_commit_decision(g1, branches(g1))
    size = lg.size()
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, old_limit[1]))
        with pytest.raises(RecoveryLogError, match="cannot write"):
            lg.log_commit_decision(g2, branches(g2))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert path.stat().st_size == size == lg.size(), "the partial record was cut off"
    assert set(lg.pending()) == {g1}
    lg.log_commit_decision(g3, branches(g3))
    lg.close()
    with RecoveryLog(path) as again:
        assert set(again.pending()) == {g1, g3}


def test_the_databases_that_keep_commit_marks_survive_reopening_and_compaction(tmp_path):
    """Forgetting one would let recovery presume aborted a transaction its mark committed."""
    path = tmp_path / "tx.log"
    with RecoveryLog(path) as lg:
        assert lg.mark_sources() == frozenset()
        lg.log_mark_source("pg:shop@db:5432")
        fsyncs = lg.fsyncs
        lg.log_mark_source("pg:shop@db:5432")  # known: nothing written
        assert lg.fsyncs == fsyncs
        lg.log_mark_source("pg:store@db:5432")
        assert [r for r in log_records(path, meta=True) if r["t"] == "marks"] == [
            {"t": "marks", "db": "pg:shop@db:5432"}, {"t": "marks", "db": "pg:store@db:5432"}]
        lg.compact()
        assert lg.mark_sources() == {"pg:shop@db:5432", "pg:store@db:5432"}
    with RecoveryLog(path) as lg:
        assert lg.mark_sources() == {"pg:shop@db:5432", "pg:store@db:5432"}
        assert lg.pending() == {}
    memory = MemoryLog()
    memory.log_mark_source("pg:shop@db:5432")
    assert memory.mark_sources() == {"pg:shop@db:5432"}
