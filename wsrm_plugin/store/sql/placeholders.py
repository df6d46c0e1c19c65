"""A statement's parameters named by number: ``?N`` is its N-th parameter again.

The store writes every statement with ``?`` placeholders.  A statement that needs one value
in several places (a receipt names its sequence, and the ranges it guesses, in two tables)
may name it again as ``?N`` instead of taking it twice: under callgrind each argument of a
prepared statement's ``EXECUTE`` costs PostgreSQL about 5 k instructions to read (its
literal parsed, coerced to the parameter's type, and evaluated), more than the few
references to a parameter in the plan.  The numbering is SQLite's own (which reads such a
statement as it is): ``?N`` is parameter N, and a bare ``?`` the one after the highest
numbered so far.  So ``a = ? AND b = ? AND c = ?1`` takes two parameters.

PostgreSQL prepares such a statement with ``$N`` (:func:`dollars`); where it is sent as
text, psycopg2 takes one ``%s`` an occurrence, so the parameters are repeated there
(:func:`expand`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["count", "dollars", "expand", "named"]

_PLACEHOLDER = re.compile(r"\?(\d*)")
_NAMED = re.compile(r"\?([a-z_][a-z0-9_]*)?")


@functools.lru_cache(maxsize=256)
def named(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` written with named placeholders (``?due``, lower case) numbered: a name's first
    occurrence becomes ``?`` (the parameter after the highest so far), each later one ``?N``
    again; with each parameter's name in order (``""`` for a bare ``?``, a parameter of its
    own each).  For a statement whose values repeat (a time, a key, a range's bounds), written
    once, so that each reaches PostgreSQL once (see the module)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1) or ""
        if name and name in names:
            return f"?{names.index(name) + 1}"
        names.append(name)
        return "?"

    if re.search(r"\?\d", sql) is not None:
        raise ValueError(f"a statement written with names numbers none itself: {sql!r}")
    return _NAMED.sub(number, sql), tuple(names)


@functools.lru_cache(maxsize=256)
def _positions(sql: str) -> tuple[int, ...]:
    """The parameter (0-based) each placeholder of ``sql`` names, in the text's order."""
    out: list[int] = []
    highest = 0
    for match in _PLACEHOLDER.finditer(sql):
        number = int(match.group(1)) if match.group(1) else highest + 1
        highest = max(highest, number)
        out.append(number - 1)
    return tuple(out)


def count(sql: str) -> int:
    """How many parameters ``sql`` takes (its highest placeholder's number)."""
    if "?" not in sql:
        return 0
    positions = _positions(sql)
    return max(positions) + 1


def dollars(sql: str) -> str:
    """``sql`` with PostgreSQL's numbered placeholders (``$1``...), for ``PREPARE``."""
    positions = iter(_positions(sql))
    return _PLACEHOLDER.sub(lambda _: f"${next(positions) + 1}", sql)


@functools.lru_cache(maxsize=512)
def _as_percent(sql: str) -> tuple[str, tuple[int, ...] | None]:
    """``sql`` with psycopg2's ``%s`` placeholders, and the parameter each one takes where
    ``sql`` names one again (else None: one each, in order)."""
    positions = _positions(sql)
    numbered = positions != tuple(range(len(positions)))
    return _PLACEHOLDER.sub("%s", sql) if numbered else sql.replace("?", "%s"), positions if numbered else None


def expand(sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any]]:
    """``sql`` and ``params`` as psycopg2 takes them (``%s`` placeholders, one value each):
    where ``sql`` names a parameter again (``?N``), its values repeated."""
    text, positions = _as_percent(sql)
    return (text, params) if positions is None else (text, tuple(params[i] for i in positions))
