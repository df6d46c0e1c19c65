"""Versioned schema: recorded on first open, re-open is idempotent, newer schemas refused."""

from __future__ import annotations

import threading

import pytest

from wsrm_plugin.store import SchemaVersionError, open_store
from wsrm_plugin.store.sql import LATEST_VERSION

from .conftest import KINDS
from .old_schema import old_messages, old_sequence, old_store
from .test_managers import enqueue, new_rms

SQL_KINDS = [KINDS[1], KINDS[2]]


def version_rows(store) -> list[int]:
    with store.begin() as tx:
        return [r[0] for r in tx.all("SELECT version FROM schema_version ORDER BY version")]


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_schema_version_is_recorded_and_reopen_is_idempotent(store_url) -> None:
    first = open_store(store_url())
    try:
        assert first.schema_version_found == 0          # a new store was migrated
        assert first.schema_version() == LATEST_VERSION
        with first.begin() as tx:
            new_rms(tx)
            enqueue(tx, n=2)
    finally:
        first.close()
    for _ in range(2):
        again = open_store(store_url())
        try:
            assert again.schema_version_found == LATEST_VERSION
            assert version_rows(again) == list(range(1, LATEST_VERSION + 1))
            with again.begin() as tx:
                assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2]
        finally:
            again.close()


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_a_newer_schema_is_refused(store_url) -> None:
    store = open_store(store_url())
    with store.begin() as tx:
        tx.write("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                 (LATEST_VERSION + 1, 0.0))
    store.close()
    with pytest.raises(SchemaVersionError, match="upgrade wsrm-plugin"):
        open_store(store_url())


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_concurrent_first_opens_migrate_once(store_url) -> None:
    stores, errors = [], []

    def opener() -> None:
        try:
            stores.append(open_store(store_url()))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert not errors, errors
        assert sorted(s.schema_version_found for s in stores) == [0] + [LATEST_VERSION] * 3
        assert version_rows(stores[0]) == list(range(1, LATEST_VERSION + 1))
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_a_version_1_store_is_upgraded_in_place_when_opened(store_url, monkeypatch) -> None:
    """Version 2 only adds the sender's indexes: the messages a version 1 store holds stay, and are
    claimable; version 5 (SQLite) reads the payloads they hold inline; version 10 keys them by
    their sequence's number."""
    with old_store(store_url(), 1, monkeypatch) as old:
        old_sequence(old)
        old_messages(old, n=3)  # the old code kept every payload in its rms_message row
        assert version_rows(old) == [1]
    upgraded = open_store(store_url())
    try:
        assert upgraded.schema_version_found == 1
        assert version_rows(upgraded) == list(range(1, LATEST_VERSION + 1))
        with upgraded.begin() as tx:
            if store_url().startswith("sqlite"):
                rows = tx.all("SELECT name FROM sqlite_master WHERE type = 'index'")
            else:
                rows = tx.all("SELECT indexname FROM pg_indexes WHERE tablename = 'rms_message'")
            assert {"rms_message_unacked", "rms_message_acked"} <= {r[0] for r in rows}
            due = tx.rms_messages.due_messages(limit=10, per_sequence=2)
            assert [(m.sequence_key, m.number) for m in due] == [("k1", 1), ("k1", 2)]
            assert [m.payload for m in due] == [b"<env>0</env>", b"<env>1</env>"]
            enqueue(tx, n=1)  # a new message beside the old ones (SQLite: its payload apart)
            assert [m.payload for m in tx.rms_messages.list_for("k1")] == [
                b"<env>0</env>", b"<env>1</env>", b"<env>2</env>", b"<env>0</env>"]
    finally:
        upgraded.close()


def _message_key(tx) -> list[str]:
    """The columns of ``rms_message``'s primary key."""
    if tx.d.name == "sqlite":
        return [r[1] for r in sorted(tx.all("SELECT pk, name FROM pragma_table_info('rms_message') WHERE pk > 0"))]
    return [r[0] for r in tx.all(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'rms_message'::regclass AND i.indisprimary "
        "ORDER BY array_position(i.indkey, a.attnum)")]


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_an_empty_version_9_store_is_keyed_by_sequence_numbers_when_opened(store_url, monkeypatch) -> None:
    with old_store(store_url(), 9, monkeypatch) as old:
        with old.begin() as tx:
            assert _message_key(tx) == ["seq_key", "number"]
    upgraded = open_store(store_url())
    try:
        assert upgraded.schema_version_found == 9
        with upgraded.begin() as tx:
            assert _message_key(tx) == ["seq", "number"]
            new_rms(tx)
            enqueue(tx, n=2)
        with upgraded.begin() as tx:
            assert [m.number for m in tx.rms_messages.list_for("k1")] == [1, 2]
            assert tx.rms.get("k1").store_id is not None
    finally:
        upgraded.close()


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_queued_messages_of_a_version_9_store_are_kept_when_it_is_opened(store_url, monkeypatch) -> None:
    """Each message takes its sequence's number: nothing is lost, sent again or left unsendable,
    the sequences' indexes hold them (claims, acknowledgements, purges by sequence), and the
    sequences made after are numbered after those found."""
    big = b"<env>" + b"x" * 5000 + b"</env>"  # SQLite keeps it apart in rms_payload (version 5)
    with old_store(store_url(), 9, monkeypatch) as old:
        for key, sid in (("k1", "seq-1"), ("k2", "seq-2"), ("k3", None)):
            old_sequence(old, key, sid)
        old_messages(old, "k1", 2, send_count=1)  # sent once, waiting for an acknowledgement
        old_messages(old, "k1", 2, first=3)
        old_messages(old, "k2", 1, acked=True, reply_pending=True)  # acknowledged, its reply to come
        old_messages(old, "k2", 1, first=2)
        old_messages(old, "k3", 1)
        if store_url().startswith("sqlite"):
            with old.begin() as tx:
                tx.write("INSERT INTO rms_payload (seq_key, number, payload) VALUES ('k2', 2, ?)", (big,))
                tx.write("UPDATE rms_message SET payload = ? WHERE seq_key = 'k2' AND number = 2", (b"",))
    upgraded = open_store(store_url())
    try:
        with upgraded.begin() as tx:
            listed = {key: [(m.number, m.send_count, m.acked, m.reply_pending, m.payload)
                            for m in tx.rms_messages.list_for(key)] for key in ("k1", "k2", "k3")}
            ids = {key: tx.rms.get(key).store_id for key in ("k1", "k2", "k3")}
        assert listed == {
            "k1": [(1, 1, False, False, b"<env>0</env>"), (2, 1, False, False, b"<env>1</env>"),
                   (3, 0, False, False, b"<env>0</env>"), (4, 0, False, False, b"<env>1</env>")],
            "k2": [(1, 0, True, True, b"<env>0</env>"),
                   (2, 0, False, False, big if store_url().startswith("sqlite") else b"<env>0</env>")],
            "k3": [(1, 0, False, False, b"<env>0</env>")]}
        assert len(set(ids.values())) == 3
        with upgraded.begin() as tx:
            assert tx.rms_messages.count_unacked() == 6
            due = tx.rms_messages.due_messages(limit=10, per_sequence=10)
            assert sorted((m.sequence_key, m.number) for m in due) == [("k1", 3), ("k1", 4), ("k2", 2)]
            assert [m.number for m in tx.rms_messages.claim_first_sends("k1", 5, next_send_at=1e12)] == [3, 4]
        with upgraded.begin() as tx:
            assert tx.rms_messages.acknowledge("k1", [(1, 4)]) == ([1, 2, 3, 4], False)
            tx.rms_messages.reply_received("k2", 1)
            tx.rms_messages.purge_acked("k2")
        with upgraded.begin() as tx:
            assert tx.rms_messages.list_for("k1") == []
            assert [m.number for m in tx.rms_messages.list_for("k2")] == [2]
            new_rms(tx, key="k4")
            enqueue(tx, key="k4", n=1)
            assert tx.rms.get("k4").store_id not in ids.values()
            assert [m.number for m in tx.rms_messages.list_for("k4")] == [1]
    finally:
        upgraded.close()


@pytest.mark.parametrize("store_url", SQL_KINDS, indirect=True)
def test_a_version_9_store_with_a_prepared_branch_is_refused_until_it_is_ended(store_url, monkeypatch) -> None:
    """Its rows are locked (PostgreSQL: the change of key would wait for ever) or its undo images
    name the old key (SQLite): the open says what to do, and changes nothing."""
    postgres = store_url().startswith("postgresql")

    def session(sql: str, params=()) -> None:  # (PostgreSQL) a statement on a connection of its own
        import psycopg2

        dsn = store_url()
        conn = psycopg2.connect(dsn if dsn.startswith("postgresql://") else dsn.removeprefix("postgresql:"))
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
        finally:
            conn.close()

    with old_store(store_url(), 9, monkeypatch) as old:
        old_sequence(old)
        old_messages(old, n=1)
        if postgres:
            session("BEGIN; UPDATE rms_message SET send_count = 1; PREPARE TRANSACTION 'wsrm_test_migration_10'")
        else:
            with old.begin() as tx:
                tx.write("INSERT INTO xa_prepared (xid, undo, prepared_at) VALUES ('x1', ?, 0)", (b"[]",))
    with pytest.raises(SchemaVersionError, match=r"1 prepared transaction\(s\) hold rows .* recovery"):
        open_store(store_url())
    with old_store(store_url(), 9, monkeypatch) as old:  # still as it was
        assert version_rows(old) == list(range(1, 10))
        if postgres:
            session("ROLLBACK PREPARED 'wsrm_test_migration_10'")
        else:
            with old.begin() as tx:
                tx.write("DELETE FROM xa_prepared")
    upgraded = open_store(store_url())
    try:
        with upgraded.begin() as tx:
            assert [(m.number, m.send_count) for m in tx.rms_messages.list_for("k1")] == [(1, 0)]
    finally:
        upgraded.close()


@pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)
def test_analyze_tells_the_planner_about_a_bulk_load(store_url) -> None:
    store = open_store(store_url())
    try:
        with store.begin() as tx:
            new_rms(tx)
            enqueue(tx, n=500)

        def planner_rows() -> float:
            with store.begin() as tx:
                return tx.one("SELECT reltuples FROM pg_class WHERE relname = 'rms_message'")[0]

        assert planner_rows() < 500  # never analyzed: the planner's figure is a guess (-1 or 0)
        store.analyze()
        assert planner_rows() == 500
    finally:
        store.close()
