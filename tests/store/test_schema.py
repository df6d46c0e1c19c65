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
        assert sorted(s.schema_version_found for s in stores) == [0, 1, 1, 1]
        assert version_rows(stores[0]) == [1]
    finally:
        for s in stores:
            s.close()
