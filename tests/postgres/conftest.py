"""Fixtures shared by the PostgreSQL tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from txmanager import TransactionManager
from txmanager.postgres import XADataSource, accelerated

#: the tests' table (see :func:`tests.postgres.support.values`)
TABLE_T = "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)"


@pytest.fixture
def dbs(pg_dsn_factory: Callable[..., str]) -> list[str]:
    """Two new databases ("a" and "b" of a transaction across them), each with the table ``t``."""
    return [pg_dsn_factory(prefix, TABLE_T) for prefix in ("db_a", "db_b")]


@pytest.fixture
def tm(tmp_path: Path) -> Iterator[TransactionManager]:
    """A transaction manager with its recovery log in the test's directory, closed after."""
    manager = TransactionManager(node="pgtest", log=tmp_path / "tx.log")
    yield manager
    manager.close()


@pytest.fixture
def sources(dbs: list[str], tm: TransactionManager) -> Iterator[list[XADataSource]]:
    """A data source on each of ``dbs`` ("ds-0", "ds-1") under ``tm``, closed after."""
    made = [XADataSource(dsn, tm, resource_name=f"ds-{i}") for i, dsn in enumerate(dbs)]
    yield made
    for ds in made:
        ds.close()


@pytest.fixture(params=["python", "c"])
def one_phase_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """The one-phase path in Python, then in C (:mod:`txmanager.postgres.accelerated`; skipped
    where the extension was not built): a test file that uses this holds for both."""
    was = accelerated.enabled()
    if not accelerated.use(request.param == "c") and request.param == "c":
        accelerated.use(was)
        pytest.skip("the C one-phase path was not built")
    yield request.param
    accelerated.use(was)
