"""Fixtures shared by the PostgreSQL tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

#: the tests' table (see :func:`tests.postgres.support.values`)
TABLE_T = "CREATE TABLE t (id serial PRIMARY KEY, v text NOT NULL)"


@pytest.fixture
def dbs(pg_dsn_factory: Callable[..., str]) -> list[str]:
    """Two new databases ("a" and "b" of a transaction across them), each with the table ``t``."""
    return [pg_dsn_factory(prefix, TABLE_T) for prefix in ("db_a", "db_b")]
