"""A statement names a parameter again as ``?N`` (SQLite's numbering), read alike by PostgreSQL
prepared (``$N``), PostgreSQL as text (psycopg2: one ``%s`` a value) and SQLite itself."""

from __future__ import annotations

import sqlite3

import pytest

from wsrm_plugin.store.sql import placeholders

SQL = "SELECT ? || ?, ?1, ? + ?3, ?2"


def test_a_bare_placeholder_is_the_one_after_the_highest_named_so_far() -> None:
    assert placeholders.count(SQL) == 3
    assert placeholders.count("SELECT 1") == 0
    assert placeholders.count("SELECT ?, ?, ?") == 3
    assert placeholders.dollars(SQL) == "SELECT $1 || $2, $1, $3 + $3, $2"
    assert placeholders.dollars("SELECT ?, ?") == "SELECT $1, $2"


def test_as_text_the_values_are_repeated_where_named_again_and_left_alone_otherwise() -> None:
    params = ("a", "b", 2)
    assert placeholders.expand(SQL, params) == ("SELECT %s || %s, %s, %s + %s, %s", ("a", "b", "a", 2, 2, "b"))
    plain = ("x", 1)
    text, values = placeholders.expand("SELECT ?, ?", plain)
    assert text == "SELECT %s, %s" and values is plain


def test_sqlite_reads_the_numbering_as_it_is() -> None:
    with sqlite3.connect(":memory:") as db:
        assert db.execute(SQL, ("a", "b", 2)).fetchone() == ("ab", "a", 4, "b")


def test_a_named_placeholder_is_numbered_at_its_first_place_and_named_again_after() -> None:
    sql, names = placeholders.named("SELECT ?t, ?, ?key || ?t, ?key, ?")
    assert sql == "SELECT ?, ?, ? || ?1, ?3, ?" and names == ("t", "", "key", "")
    assert placeholders.count(sql) == 4
    with sqlite3.connect(":memory:") as db:
        assert db.execute(sql, (1, 2, "k", 4)).fetchone() == (1, 2, "k1", "k", 4)


def test_a_statement_written_with_names_numbers_none_itself() -> None:
    with pytest.raises(ValueError):
        placeholders.named("SELECT ?x, ?1")
