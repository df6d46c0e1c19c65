"""Helpers shared by the PostgreSQL tests: statements on a session of their own, outside any
transaction under test, so that what they read is what the server committed; a manager and
the two data sources of a transaction across two databases."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg2

from txmanager import TransactionManager
from txmanager.transaction import Checkpoint
from txmanager.postgres import XADataSource


def profiled(work: Any, profile: Any) -> None:
    """Run ``work()`` with ``profile`` as ``sys.setprofile``'s hook, taken off after whatever
    happens: the tests that count the calls a transaction makes (counted, not timed)."""
    import sys

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)


def run(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]] | None:
    """Run ``sql`` in autocommit on a new connection; its rows, or None for a statement without any."""
    conn = psycopg2.connect(dsn)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def values(dsn: str) -> list[str]:
    """The committed values of the tests' table ``t``, in the order they were inserted."""
    return [v for (v,) in run(dsn, "SELECT v FROM t ORDER BY id") or []]


def prepared_gids(dsn: str) -> list[str]:
    """The transactions prepared in ``dsn``'s database and not yet finished."""
    return [g for (g,) in run(dsn, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()") or []]


def insert(conn: Any, value: str) -> None:
    """Insert ``value`` into ``t`` through ``conn`` (in whatever transaction it is in)."""
    with conn.cursor() as cur:
        cur.execute("INSERT INTO t (v) VALUES (%s)", (value,))


@contextlib.contextmanager
def two_sources(dbs: Sequence[str], log: str | os.PathLike[str], *, node: str, marks: bool = True,
                checkpoint: Checkpoint | None = None, **options: Any
                ) -> Iterator[tuple[TransactionManager, XADataSource, XADataSource]]:
    """A transaction manager (``node``, its recovery log at ``log``, its ``checkpoint``) and XA
    data sources "a" and "b" on the two databases of ``dbs`` (b keeping commit marks when
    ``marks``; ``options`` for both), all closed after."""
    tm = TransactionManager(node=node, log=log, checkpoint=checkpoint)
    a = XADataSource(dbs[0], tm, resource_name="a", **options)
    b = XADataSource(dbs[1], tm, resource_name="b", commit_marks=marks, **options)
    try:
        yield tm, a, b
    finally:
        a.close()
        b.close()
        tm.close()
