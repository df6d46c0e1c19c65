"""Xid: validation, identity, ownership and the PostgreSQL gid form psycopg2 writes."""

from __future__ import annotations

import base64
import dataclasses
import pickle

import psycopg2.extensions
import pytest
from hypothesis import given, strategies as st

from txmanager.xid import FORMAT_ID, InvalidXidError, Xid


def test_parts_longer_than_64_bytes_are_refused_with_the_limit_named():
    with pytest.raises(InvalidXidError, match="gtrid is 65 bytes long; XA allows at most 64"):
        Xid(FORMAT_ID, b"g" * 65)
    with pytest.raises(InvalidXidError, match="bqual is 65 bytes long"):
        Xid(FORMAT_ID, b"g", b"b" * 65)
    assert Xid(FORMAT_ID, b"g" * 64, b"b" * 64).gtrid == b"g" * 64  # the limit itself is fine


@pytest.mark.parametrize("bad", [
    dict(format_id=2**31, gtrid=b"g"), dict(format_id=-2, gtrid=b"g"),
    dict(format_id="1", gtrid=b"g"), dict(format_id=True, gtrid=b"g"),
    dict(format_id=1, gtrid=b""), dict(format_id=1, gtrid=12), dict(format_id=1, gtrid=b"g", bqual=3.0),
])
def test_malformed_parts_are_refused(bad):
    with pytest.raises(InvalidXidError):
        Xid(**bad)


def test_equality_and_hash_follow_the_three_parts():
    a, b = Xid(7, "g", "b"), Xid(7, b"g", b"b")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Xid(8, "g", "b") and a != Xid(7, "g", "c") and a != Xid(7, "h", "b")


def test_new_global_names_its_node_and_is_never_reused():
    xids = {Xid.new_global("node-1") for _ in range(1000)}
    assert len(xids) == 1000
    x = next(iter(xids))
    assert x.format_id == FORMAT_ID and x.bqual == b"" and x.node == "node-1"
    assert x.is_ours() and x.is_ours("node-1") and not x.is_ours("node-2")
    assert x.branch(b"\x01").global_xid() == x


def test_foreign_xids_are_not_ours():
    assert not Xid(4660, b"node-1|abc").is_ours()           # another format id
    assert not Xid(FORMAT_ID, b"no-separator").is_ours()    # our format, not our gtrid shape
    with pytest.raises(InvalidXidError, match="node name"):
        Xid.new_global("bad node name with spaces")


def test_gid_form_is_the_one_psycopg2_writes_and_reads():
    x = Xid(FORMAT_ID, "gt", "bq")
    assert x.to_pg_gid() == str(psycopg2.extensions.Xid(FORMAT_ID, "gt", "bq"))
    theirs = psycopg2.extensions.Xid.from_string(x.to_pg_gid())
    assert (theirs.format_id, theirs.gtrid, theirs.bqual) == (FORMAT_ID, "gt", "bq")


@pytest.mark.parametrize("gid", ["plain-string-gid", "1_@@_AA==", "x_AA==_AA==", "1_AA==", ""])
def test_gids_not_in_xa_form_parse_to_none_and_from_text_says_why(gid):
    assert Xid.from_pg_gid(gid) is None
    with pytest.raises(InvalidXidError, match="formatID_base64_base64"):
        Xid.from_text(gid)


@given(st.integers(0, 2**31 - 1), st.binary(min_size=1, max_size=64), st.binary(max_size=64))
def test_gid_and_text_forms_round_trip(fmt, gtrid, bqual):
    x = Xid(fmt, gtrid, bqual)
    assert Xid.from_pg_gid(x.to_pg_gid()) == x == Xid.from_text(x.to_text())
    assert str(x) and repr(x).startswith("Xid(")


@given(st.integers(0, 2**31 - 1), st.binary(min_size=1, max_size=64), st.binary(max_size=64),
       st.booleans())
def test_the_cached_gid_is_the_gid_of_the_parts(fmt, gtrid, bqual, global_gid_first):
    """The gid is computed once per xid and handed down to branches; whichever
    way it was obtained, it is exactly the gid of the three parts."""
    g = Xid(fmt, gtrid)
    if global_gid_first:
        g.to_pg_gid()
    branch = g.branch(bqual)
    fresh = Xid(fmt, gtrid, bqual)
    assert branch.to_pg_gid() == fresh.to_pg_gid() == "%d_%s_%s" % (
        fmt, base64.b64encode(gtrid).decode(), base64.b64encode(bqual).decode())
    assert branch.to_pg_gid() is branch.to_pg_gid()
    assert branch == fresh and hash(branch) == hash(fresh) and repr(branch) == repr(fresh)
    assert branch.global_xid() == g


def test_an_xid_with_its_gid_cached_pickles_and_stays_frozen():
    x = Xid.new_global("node-1").branch("0")
    x.to_pg_gid()
    y = pickle.loads(pickle.dumps(x))
    assert y == x and y.to_pg_gid() == x.to_pg_gid()
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.bqual = b"1"  # type: ignore[misc]


def test_the_longest_node_name_still_makes_a_valid_gtrid():
    x = Xid.new_global("n" * 32)
    assert len(x.gtrid) <= 64 and x.node == "n" * 32
    assert Xid(x.format_id, x.gtrid) == x  # passes the validating constructor too


def test_a_forked_child_never_repeats_its_parents_gtrids():
    import os
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the gtrids it makes, then leave at once
        os.close(read)
        os.write(write, b"\n".join(Xid.new_global("node-1").gtrid for _ in range(100)))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        child = set(f.read().split(b"\n"))
    os.waitpid(pid, 0)
    parent = {Xid.new_global("node-1").gtrid for _ in range(100)}
    assert len(child) == 100 and not child & parent
