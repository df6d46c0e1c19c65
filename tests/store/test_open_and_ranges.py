"""open_store URLs, and the text form the SQL stores keep number ranges in."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wsrm_plugin.store import StoreError, open_store
from wsrm_plugin.store.api import MAX_MESSAGE_NUMBER, AckRanges, format_ranges, parse_ranges
from wsrm_plugin.store.memory import MemoryStore
from wsrm_plugin.store.sqlite import SqliteStore


def test_open_store_urls(tmp_path, monkeypatch) -> None:
    mem = open_store("memory:?lock_timeout=2.5")
    assert isinstance(mem, MemoryStore) and mem.lock_timeout == 2.5
    absolute = open_store(f"sqlite:///{tmp_path}/a.db", lock_timeout=4)
    assert isinstance(absolute, SqliteStore) and absolute.path == f"{tmp_path}/a.db"
    assert absolute.lock_timeout == 4
    monkeypatch.chdir(tmp_path)
    relative = open_store("sqlite:///rel.db?pool_size=2")
    assert relative.path == str(tmp_path / "rel.db") and relative.pool_size == 2
    for s in (mem, absolute, relative):
        s.close()


@pytest.mark.parametrize("url, message", [
    ("mongodb://x", "unsupported store URL"),
    ("sqlite://host/x.db", "sqlite:///relative"),
    ("sqlite:///", "sqlite:///relative"),
    ("memory:?colour=red", "unknown store option 'colour'"),
    ("memory:?lock_timeout=soon", "not a number"),
])
def test_bad_urls_say_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url)


def test_a_missing_directory_is_reported(tmp_path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        open_store(f"sqlite:///{tmp_path}/no/such/dir/x.db")


def test_ranges_text_form() -> None:
    assert format_ranges(AckRanges()) == "" and parse_ranges("") == AckRanges()
    assert format_ranges(AckRanges.from_ranges([(1, 3), (5, 5), (7, 9)])) == "1-3,5,7-9"
    assert parse_ranges("7-9,1-3,5,4").ranges == ((1, 5), (7, 9))
    for corrupt in ("1-x", "3-1", "0-2", f"1-{MAX_MESSAGE_NUMBER + 1}", "1,,2"):
        with pytest.raises(StoreError, match="corrupt range"):
            parse_ranges(corrupt)


@given(st.lists(st.tuples(st.integers(1, MAX_MESSAGE_NUMBER), st.integers(1, MAX_MESSAGE_NUMBER))
                .map(sorted).map(tuple), max_size=20))
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # a busy CI machine is slow, not wrong
def test_ranges_survive_the_text_form(pairs) -> None:
    ranges = AckRanges.from_ranges(pairs)
    assert parse_ranges(format_ranges(ranges)) == ranges


@pytest.mark.postgres
def test_postgresql_urls(fresh_db: str) -> None:
    from psycopg2.extensions import parse_dsn

    from wsrm_plugin.store.postgres import PostgresStore
    p = parse_dsn(fresh_db)
    url = (f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"
           "?lock_timeout=2.5&connect_timeout=10")
    for store in (open_store(url), open_store("postgresql:" + fresh_db, pool_size=1)):
        try:
            assert isinstance(store, PostgresStore)
            assert store.url == f"postgresql:{p['dbname']}@{p['host']}:{p['port']}"
            with store.begin() as tx:
                assert tx.rms.list_all() == []
                assert tx.one("SHOW lock_timeout")[0] == ("2500ms" if "?" in store.dsn else "30s")
        finally:
            store.close()
