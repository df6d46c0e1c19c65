"""Versioned schema: recorded on first open, re-open is idempotent, newer schemas refused."""

from __future__ import annotations

import threading

import pytest

from wsrm_plugin.store import SchemaVersionError, open_store
from wsrm_plugin.store.sql import LATEST_VERSION

from .conftest import KINDS
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
    claimable; version 5 (SQLite) reads the payloads they hold inline."""
    import dataclasses

    from wsrm_plugin.store import sqlite as sqlite_store
    from wsrm_plugin.store.sql import schema

    with monkeypatch.context() as old_code:
        old_code.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        old_code.setattr(schema, "LATEST_VERSION", 1)
        # the old code kept every payload in its rms_message row
        old_code.setattr(sqlite_store, "SQLITE", dataclasses.replace(sqlite_store.SQLITE, payload_apart=False))
        old = open_store(store_url())
        with old.begin() as tx:
            new_rms(tx)
            tx.rms.update("k1", sequence_id="seq-1", started=True, next_control_at=None)
            enqueue(tx, n=3)
        assert version_rows(old) == [1]
        old.close()
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
