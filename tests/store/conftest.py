"""One behavioural suite, three stores: ``store`` is parametrized over memory,
SQLite (a file in the test's tmp dir) and PostgreSQL (a fresh database on the
session's throwaway server, marked ``postgres``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from wsrm_plugin.store import StorageManager, open_store

KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """``make() -> url`` for the test's store kind (the same URL on every call)."""
    kind = request.param
    if kind == "memory":
        return lambda: "memory:"
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/store.db"
        return lambda: url
    dsn = request.getfixturevalue("fresh_db")
    return lambda: dsn if dsn.startswith("postgresql") else "postgresql:" + dsn


@pytest.fixture
def open_kind(store_url: Callable[[], str]) -> Iterator[Callable[..., StorageManager]]:
    """``open(**options)``: a store of the test's kind, closed at teardown."""
    opened: list[StorageManager] = []

    def _open(**options) -> StorageManager:
        store = open_store(store_url(), **options)
        opened.append(store)
        return store

    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def store(open_kind: Callable[..., StorageManager]) -> StorageManager:
    return open_kind(lock_timeout=10.0)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "store_url" in metafunc.fixturenames and not any(
            m.name == "parametrize" and "store_url" in str(m.args[0])
            for m in metafunc.definition.iter_markers()):
        metafunc.parametrize("store_url", KINDS, indirect=True)
