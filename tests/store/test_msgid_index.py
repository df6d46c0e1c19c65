"""Only the requests that await a reply are indexed by their message id (schema version 13, issue 33).

``rms_message_msgid`` is read only to correlate a reply with its request, yet every enqueue,
one-way messages too, wrote an entry at a random place of it (message ids are UUIDs).  These
tests check that a one-way message is no longer in it (nor found by its id), that a request is
found before its reply and after (its delivery looks it up once the reply's receipt marked it
answered), that the look-ups go by the index, and that a version 12 store is upgraded with the
requests it holds still found.
"""

from __future__ import annotations

import time

import pytest

from wsrm_plugin.store import SchemaVersionError, open_store
from wsrm_plugin.store.sql import LATEST_VERSION
from wsrm_plugin.store.sql.rms import _REQUEST

from .conftest import KINDS
from .old_schema import old_store
from .test_managers import new_rms

SQL_KINDS = pytest.mark.parametrize("store_url", [KINDS[1], KINDS[2]], indirect=True)


def _enqueue(tx, message_id: str, **kw):
    return tx.rms_messages.enqueue("k1", b"<env/>", action="urn:op", soap_version="1.2", message_id=message_id, **kw)


@SQL_KINDS
def test_only_requests_are_found_by_their_message_id(open_kind) -> None:
    store = open_kind()
    with store.begin() as tx:
        new_rms(tx)
        one_way = _enqueue(tx, "urn:one-way")
        request = _enqueue(tx, "urn:request", awaits_reply=True)
        called = _enqueue(tx, "urn:called", reply_callback="pkg.mod:on_reply")
    with store.begin() as tx:
        assert tx.rms_messages.find_by_message_id("urn:one-way") is None
        assert tx.rms_messages.get("k1", one_way.number) == one_way  # still there, by its key
        assert tx.rms_messages.find_by_message_id("urn:request") == request
        assert tx.rms_messages.find_by_message_id("urn:called") == called
        assert tx.rms_messages.mark_answered("urn:one-way") is None
        assert tx.rms_messages.mark_answered("urn:request") == ("k1", request.number, False)
        assert tx.rms_messages.mark_answered("urn:request") is None  # answered already
    with store.begin() as tx:  # the reply's delivery looks the request up after its receipt
        found = tx.rms_messages.find_by_message_id("urn:request")
        assert (found.number, found.reply_pending) == (request.number, False)


@SQL_KINDS
def test_the_index_holds_only_requests_and_the_look_ups_go_by_it(open_kind) -> None:
    store = open_kind()
    sqlite = store.url.startswith("sqlite")
    with store.begin() as tx:
        new_rms(tx)
        for i in range(50):
            _enqueue(tx, f"urn:m{i}", awaits_reply=i % 10 == 0)
    with store.begin() as tx:
        if sqlite:
            definition = tx.one("SELECT sql FROM sqlite_master WHERE name = 'rms_message_msgid'")[0]
            plan = " ".join(str(r) for r in tx.all(f"EXPLAIN QUERY PLAN SELECT seq FROM rms_message WHERE {_REQUEST}",
                                                   ("urn:m10",)))
        else:
            definition = tx.one("SELECT pg_get_indexdef('rms_message_msgid'::regclass)")[0]
            tx.execute("SET LOCAL enable_seqscan TO off")
            plan = " ".join(r[0] for r in tx.all(f"EXPLAIN SELECT seq FROM rms_message WHERE {_REQUEST}",
                                                 ("urn:m10",)))
        assert definition.rstrip().endswith("WHERE awaits_reply"), definition
        assert "rms_message_msgid" in plan, plan
        assert [m.message_id for m in (tx.rms_messages.find_by_message_id(f"urn:m{i}") for i in range(50))
                if m is not None] == [f"urn:m{i}" for i in range(0, 50, 10)]


def _insert_as_version_12(tx, seq, number: int, message_id: str, callback: str | None, pending: bool) -> None:
    """An enqueue's row as version 12 wrote it: without ``awaits_reply``."""
    t = time.time()
    tx.write("INSERT INTO rms_message (seq, number, message_id, action, soap_version, payload, reply_callback, "
             "reply_pending, next_send_at, created_at) VALUES (?, ?, ?, 'urn:op', '1.2', ?, ?, ?, ?, ?)",
             (seq, number, message_id, b"<env/>", callback, pending, t, t))


def _version_12_rows(store) -> None:
    """As version 12 wrote them: a one-way message, a request waiting for its reply, a request
    answered with a callback (its delivery still to look it up), one answered without."""
    with store.begin() as tx:
        new_rms(tx)
        seq = tx.one("SELECT id FROM rms_sequence WHERE seq_key = 'k1'")[0]
        for number, message_id, callback, pending in ((1, "urn:one-way", None, False), (2, "urn:pending", None, True),
                                                      (3, "urn:called", "pkg.mod:on_reply", False),
                                                      (4, "urn:answered", None, False)):
            _insert_as_version_12(tx, seq, number, message_id, callback, pending)
        tx.write("UPDATE rms_sequence SET highest_number = 4 WHERE id = ?", (seq,))


@SQL_KINDS
def test_a_version_12_store_keeps_finding_its_requests_when_upgraded(store_url, monkeypatch) -> None:
    with old_store(store_url(), 12, monkeypatch) as old:
        _version_12_rows(old)
    upgraded = open_store(store_url())
    try:
        assert (upgraded.schema_version_found, upgraded.schema_version()) == (12, LATEST_VERSION)
        with upgraded.begin() as tx:
            found = {m: getattr(tx.rms_messages.find_by_message_id(m), "number", None)
                     for m in ("urn:one-way", "urn:pending", "urn:called", "urn:answered")}
            assert found == {"urn:one-way": None, "urn:pending": 2, "urn:called": 3, "urn:answered": None}
            assert tx.rms_messages.mark_answered("urn:pending") == ("k1", 2, False)
            assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2, 3, 4]
    finally:
        upgraded.close()


@SQL_KINDS
def test_a_version_12_process_still_running_on_the_upgraded_store_has_its_requests_found(store_url, monkeypatch) -> None:
    """A rolling upgrade: a process of version 12 keeps enqueuing after another one upgraded the
    store; its rows lack ``awaits_reply``, and its request must be found when the reply comes."""
    with old_store(store_url(), 12, monkeypatch) as old:
        _version_12_rows(old)
    upgraded = open_store(store_url())
    try:
        with upgraded.begin() as tx:  # the version 12 process, still running
            seq = tx.one("SELECT id FROM rms_sequence WHERE seq_key = 'k1'")[0]
            _insert_as_version_12(tx, seq, 5, "urn:late-request", None, True)
            tx.write("UPDATE rms_sequence SET highest_number = 5 WHERE id = ?", (seq,))
        with upgraded.begin() as tx:
            assert getattr(tx.rms_messages.find_by_message_id("urn:late-request"), "number", None) == 5
            assert tx.rms_messages.mark_answered("urn:late-request") == ("k1", 5, False)
            assert tx.rms_messages.find_by_message_id("urn:one-way") is None  # upgraded as before
            assert tx.rms_messages.find_by_message_id("urn:pending").number == 2
    finally:
        upgraded.close()


@pytest.mark.parametrize("store_url", [KINDS[1]], indirect=True)
def test_a_version_12_store_with_a_prepared_branch_is_refused_until_it_is_ended(store_url, monkeypatch) -> None:
    """As for version 10 (``test_schema``, which also runs PostgreSQL's prepared branch through
    the same check): a SQLite branch's undo images lack the new column."""
    with old_store(store_url(), 12, monkeypatch) as old:
        with old.begin() as tx:
            tx.write("INSERT INTO xa_prepared (xid, undo, prepared_at) VALUES ('x1', ?, 0)", (b"[]",))
    with pytest.raises(SchemaVersionError, match=r"version 13 adds a column .* 1 prepared transaction"):
        open_store(store_url())
    with old_store(store_url(), 12, monkeypatch) as old:
        with old.begin() as tx:
            tx.write("DELETE FROM xa_prepared")
    upgraded = open_store(store_url())
    upgraded.close()
