"""A PostgreSQL statement's plain parameters written into its text, as psycopg2 would write them.

psycopg2 sends no parameters apart: it writes each into the query string itself, through its
adapters, and for an ``int``, a ``float`` or a ``bool`` that costs far more than the value:
the adapter is looked up, asked for a ``prepare`` method it does not have (an
``AttributeError`` made and cleared each time), then for ``getquoted``.  Under callgrind that
was about 9 k instructions a parameter, and the store's statements carry about 50 a message on
each side of an XA request-reply call (the receipt, the take, the reply's enqueue, the
acknowledgement): near a tenth of each side's instructions.  Written here, in Python, a value
costs a few hundred.

Only what can be written exactly as psycopg2 writes it is: ``None``, ``bool``, ``int`` and
``float`` (its ``repr``; NaN and the infinities as psycopg2's casts), and a ``str`` where its
quoting is plain SQL: its encoding UTF-8, where no byte of a multi-byte character is a quote,
no NUL (which psycopg2 refuses), and a backslash, if it has one, itself (the session's
``standard_conforming_strings`` on, asked then: a string without one means the same either
way, so most statements never ask).  Its quotes doubled are then the whole of the escaping.
And ``bytes`` or ``bytearray`` where a backslash is itself too, on a server of 9.0 or later:
``'\\x<hex>'::bytea``, libpq's escape that psycopg2's ``Binary`` sends (its adapter costs as an
``int``'s, and one value left to it made psycopg2 format the whole text).  Anything else
(memoryviews, subclasses, dates...) is left to psycopg2 with its ``%s``.  PostgreSQL reads the
same values either way (the same text, where psycopg2 writes no ``E''`` of its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["inline"]

_FLOATS = {math.inf: "'Infinity'::float", -math.inf: "'-Infinity'::float"}
#: the types psycopg2 writes as ``bytea`` (its ``Binary``), and so does :func:`_literal`
_BINARY = (bytes, bytearray)


def _literal(value: Any, conn: Any) -> str | None:
    """``value`` as psycopg2 writes it into a query, or None: left to psycopg2.  The kinds
    :func:`inline`'s loop does not write itself: a plain ``str`` and an ``int`` are written
    there, without a call, and only there (most of a statement's parameters are those)."""
    if value is None:
        return "NULL"
    kind = type(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        if value != value:
            return "'NaN'::float"
        text = _FLOATS.get(value) or repr(value)
        return " " + text if text[0] == "-" else text
    if kind in _BINARY:
        # psycopg2's Binary on a session to PostgreSQL 9.0 or later: libpq's hex escape, whose
        # one backslash is itself only where standard_conforming_strings is on
        return "'\\x" + value.hex() + "'::bytea" if conn.encoding == "UTF8" and standard_strings(conn) \
            and conn.server_version >= 90000 else None
    return None


def standard_strings(conn: Any) -> bool:
    """Is a backslash in a plain string literal itself on ``conn``'s session now (its
    ``standard_conforming_strings`` on)?  Asked of libpq each time, at more cost than the rest of
    a statement's parameters together: a session can ``SET`` it, a rollback can undo that
    ``SET``, and an XA branch's session is shared with the application, so no copy of it could
    be trusted.  Only a literal whose meaning depends on it asks."""
    return conn.get_parameter_status("standard_conforming_strings") == "on"


def inline(conn: Any, text: str, params: Sequence[Any]) -> tuple[str, tuple[Any, ...] | None]:
    """``text`` (psycopg2's ``%s`` placeholders) and ``params`` as ``cursor.execute`` is to get
    them on ``conn``: the parameters written in where they can be (see the module), the rest
    still placeholders, with their parameters.  None for the parameters when none is left:
    the text is then the query as sent (psycopg2 formats nothing).  A text with any other
    ``%`` in it, or whose placeholders do not match ``params``, is given back as it came."""
    parts = text.split("%s")
    if len(parts) != len(params) + 1 or "%" in text.replace("%s", ""):
        return text, tuple(params)
    if not params:
        return text, None
    utf8 = conn.encoding == "UTF8"  # psycopg2's own: the encoding it sends the text in
    strings: bool | None = None  # standard_strings(conn), asked once a literal depends on it
    out = [parts[0]]
    left: list[Any] = []
    percent = False  # a % written in with a string
    for value, part in zip(params, parts[1:]):  # noqa: B905 -- lengths checked above
        kind = type(value)
        # a plain str: its quotes doubled are the whole of the escaping in UTF-8 (no byte of a
        # character is a quote) without a NUL (psycopg2 refuses one) where a backslash, if it
        # has one, is itself (standard strings, asked of the session then)
        if kind is str and utf8 and "\x00" not in value and (
                "\\" not in value or (strings if strings is not None else (strings := standard_strings(conn)))):
            if "'" in value:
                value = value.replace("'", "''")
            percent = percent or "%" in value
            out.append("'" + value + "'")
        elif kind is int:
            out.append(str(value) if value >= 0 else f" {value}")  # psycopg2's space: "- -1" is no comment
        else:
            literal = _literal(value, conn)
            if literal is None:
                left.append(value)
                literal = "%s"
            out.append(literal)
        out.append(part)
    if not left:
        return "".join(out), None
    if percent:  # psycopg2 formats the text: a % written in with a value must stay one
        out[1::2] = [o if o == "%s" else o.replace("%", "%%") for o in out[1::2]]
    return "".join(out), tuple(left)
