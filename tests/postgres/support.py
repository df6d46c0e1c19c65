"""Helpers shared by the PostgreSQL tests: statements on a session of their own, outside any
transaction under test, so that what they read is what the server committed."""

from __future__ import annotations

from typing import Any

import psycopg2


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
