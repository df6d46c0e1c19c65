"""Transaction branch identifiers (X/Open XA ``XID``).

An :class:`Xid` is what every resource manager sees of a global transaction:
a format id, a global transaction id (gtrid) shared by every branch, and a
branch qualifier (bqual) that tells the branches apart.  This project stamps its
own :data:`FORMAT_ID` and puts the node name at the front of the gtrid, so that
recovery on one node can tell its own in-doubt branches from those of another
transaction manager (or another node of this one) sharing the same database:
it must never roll back a branch it did not create.

PostgreSQL knows prepared transactions by a text ``gid``.  psycopg2 writes an
XA xid as ``formatID_base64(gtrid)_base64(bqual)``; :meth:`Xid.to_pg_gid` and
:meth:`Xid.from_pg_gid` speak exactly that form, so branches prepared by this
package, by psycopg2's own ``tpc_*`` API or by a Java XA driver interoperate.
"""

from __future__ import annotations

import base64
import binascii
import functools
import itertools
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FORMAT_ID",
    "MAXGTRIDSIZE",
    "MAXBQUALSIZE",
    "Xid",
    "InvalidXidError",
    "default_node_name",
]

#: ``b"WSRX"`` read as a big-endian int32: the format id of this project's xids.
FORMAT_ID: int = 0x57535258
MAXGTRIDSIZE: int = 64
MAXBQUALSIZE: int = 64

_NODE_SEP = b"|"
_NODE_RE = re.compile(r"^[A-Za-z0-9._\-]{1,32}$")
_PG_GID_RE = re.compile(r"^(-?\d+)_([A-Za-z0-9+/=]*)_([A-Za-z0-9+/=]*)$")


class InvalidXidError(ValueError):
    """An xid part is too long, of the wrong type, or a gid cannot be parsed."""


def default_node_name() -> str:
    """A node name stable across restarts of the same host (the hostname, trimmed)."""
    name = re.sub(r"[^A-Za-z0-9._\-]", "-", socket.gethostname())[:32]
    return name or "node"


def _as_bytes(value: bytes | str, what: str, limit: int) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    elif not isinstance(value, bytes):
        raise InvalidXidError(f"{what} must be bytes or str, not {type(value).__name__}")
    if len(value) > limit:
        raise InvalidXidError(f"{what} is {len(value)} bytes long; XA allows at most {limit}")
    return value


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


@functools.lru_cache(maxsize=64)
def _gtrid_prefix(node: str) -> bytes:
    """``node|`` for a valid node name: checked once per name, not once per transaction."""
    if not isinstance(node, str) or not _NODE_RE.match(node):
        raise InvalidXidError(f"node name {node!r} must be 1-32 chars of [A-Za-z0-9._-]")
    return node.encode() + _NODE_SEP


# The unique part of a gtrid: 64 random bits drawn once per process, then a
# counter (14 hex digits, more transactions than a process will ever run).
# As unique as fresh random bits per transaction -- a restarted process or
# another process of the node draws other random bits -- without a getrandom
# system call per transaction.  30 hex digits, so a 32-character node name
# still fits XA's 64 bytes.
_unique_prefix = b""
_unique_counter = itertools.count()


def _draw_unique_prefix() -> None:
    global _unique_prefix, _unique_counter
    _unique_prefix = binascii.hexlify(os.urandom(8))
    _unique_counter = itertools.count()


_draw_unique_prefix()
os.register_at_fork(after_in_child=_draw_unique_prefix)  # a forked child must not repeat us


@dataclass(frozen=True, slots=True)
class Xid:
    """An immutable, hashable XA transaction branch identifier.

    Besides the three XA parts an xid carries a cache of its PostgreSQL gid
    (not part of equality or hashing): a branch's gid is needed at start, in
    the recovery log and at commit, and building it is two base64 encodings.
    """

    format_id: int
    gtrid: bytes
    bqual: bytes = b""
    _gid: str | None = field(default=None, init=False, repr=False, compare=False)

    def __init__(self, format_id: int, gtrid: bytes | str, bqual: bytes | str = b"") -> None:
        if not isinstance(format_id, int) or isinstance(format_id, bool):
            raise InvalidXidError(f"format_id must be an int, not {type(format_id).__name__}")
        if not -1 <= format_id <= 0x7FFFFFFF:
            raise InvalidXidError(f"format_id {format_id} does not fit a signed 32-bit XA format id")
        gt = _as_bytes(gtrid, "gtrid", MAXGTRIDSIZE)
        if not gt:
            raise InvalidXidError("gtrid must not be empty")
        _set_format_id(self, format_id)
        _set_gtrid(self, gt)
        _set_bqual(self, _as_bytes(bqual, "bqual", MAXBQUALSIZE))
        _set_gid(self, None)

    @classmethod
    def _trusted(cls, format_id: int, gtrid: bytes, bqual: bytes, gid: str | None = None) -> "Xid":
        """An xid from parts already known to be valid bytes within the limits.

        The transaction manager builds an xid per transaction and one per
        branch from parts it made itself; validating them again was a
        measurable share of a one-phase transaction.  Never call this with
        parts from outside (user input, a database, a file): use ``Xid(...)``.
        """
        self = _new_object(cls)
        _set_format_id(self, format_id)
        _set_gtrid(self, gtrid)
        _set_bqual(self, bqual)
        _set_gid(self, gid)
        return self

    # -- construction -------------------------------------------------------

    @classmethod
    def new_global(cls, node: str | None = None) -> "Xid":
        """A fresh global id ``node|<64 random bits><counter>`` with an empty bqual.

        The random bits (drawn per process) rather than a plain sequence make
        sure two processes of one node, or a node restarted with an empty log,
        can never reuse a gtrid.
        """
        gtrid = _gtrid_prefix(node or default_node_name()) + _unique_prefix + b"%014x" % next(_unique_counter)
        if cls is not Xid:
            return cls._trusted(FORMAT_ID, gtrid, b"")
        xid: Any = _XidParts()  # see _XidParts
        xid.format_id = FORMAT_ID
        xid.gtrid = gtrid
        xid.bqual = b""
        xid._gid = None
        xid.__class__ = Xid
        return xid

    def branch(self, bqual: bytes | str) -> "Xid":
        """The branch of this global transaction with the given qualifier."""
        if type(bqual) is bytes and len(bqual) <= MAXBQUALSIZE:
            bq = bqual
        else:
            bq = _as_bytes(bqual, "bqual", MAXBQUALSIZE)
        gid = self._gid
        if gid is not None and not self.bqual:
            gid += _b64(bq)  # a global xid's gid ends in "_" (the empty bqual)
        xid: Any = _XidParts()  # see _XidParts
        xid.format_id = self.format_id
        xid.gtrid = self.gtrid
        xid.bqual = bq
        xid._gid = gid
        xid.__class__ = Xid
        return xid

    def global_xid(self) -> "Xid":
        """The xid with the branch qualifier stripped (names the global transaction)."""
        return Xid._trusted(self.format_id, self.gtrid, b"")

    # -- ownership -----------------------------------------------------------

    @property
    def node(self) -> str | None:
        """The node that created this xid, or None when it is not one of ours."""
        if self.format_id != FORMAT_ID or _NODE_SEP not in self.gtrid:
            return None
        try:
            return self.gtrid.split(_NODE_SEP, 1)[0].decode("ascii")
        except UnicodeDecodeError:
            return None

    def is_ours(self, node: str | None = None) -> bool:
        """True when this xid was created by this project (and by ``node``, if given)."""
        owner = self.node
        return owner is not None and (node is None or owner == node)

    # -- PostgreSQL gid form ---------------------------------------------------

    def to_pg_gid(self) -> str:
        """The gid psycopg2 uses for this xid in ``PREPARE TRANSACTION`` (computed once)."""
        gid = self._gid
        if gid is None:
            gid = f"{self.format_id:d}_{_b64(self.gtrid)}_{_b64(self.bqual)}"
            _set_gid(self, gid)
        return gid

    @classmethod
    def from_pg_gid(cls, gid: str) -> "Xid | None":
        """Parse a gid written by :meth:`to_pg_gid` (or psycopg2, or a JDBC driver).

        Returns None for a gid that is not in XA form (a plain-string gid of
        someone else's ``PREPARE TRANSACTION 'foo'``): such a branch is never ours.
        """
        m = _PG_GID_RE.match(gid)
        if not m:
            return None
        try:
            gtrid = base64.b64decode(m.group(2), validate=True)
            bqual = base64.b64decode(m.group(3), validate=True)
            return cls(int(m.group(1)), gtrid, bqual)
        except (binascii.Error, InvalidXidError):
            return None

    # -- text form for logs and operators -------------------------------------

    def __str__(self) -> str:
        return f"{self.format_id:#x}:{_printable(self.gtrid)}:{_printable(self.bqual)}"

    def __repr__(self) -> str:
        return f"Xid({self.format_id:#x}, {self.gtrid!r}, {self.bqual!r})"

    def to_text(self) -> str:
        """A lossless text form (the PostgreSQL gid) for logs, files and CLI arguments."""
        return self.to_pg_gid()

    @classmethod
    def from_text(cls, text: str) -> "Xid":
        xid = cls.from_pg_gid(text)
        if xid is None:
            raise InvalidXidError(f"{text!r} is not an xid in formatID_base64_base64 form")
        return xid


_new_object = object.__new__
# The slots' own setters: they bypass the frozen dataclass's __setattr__, which
# is there to stop users, not this module.  Read from the class's namespace: the
# slot descriptors, which attribute access on the class would type as the fields.
_set_format_id = vars(Xid)["format_id"].__set__
_set_gtrid = vars(Xid)["gtrid"].__set__
_set_bqual = vars(Xid)["bqual"].__set__
_set_gid = vars(Xid)["_gid"].__set__


class _XidParts:
    """An :class:`Xid` under construction: the same slots, without the frozen dataclass's
    ``__setattr__``.  The manager makes two xids per transaction (the global one and its
    branch); filling the slots through their descriptors' ``__set__`` cost 5,000 client
    instructions an xid (callgrind), plain stores then a change of class cost 2,500."""

    __slots__ = ("format_id", "gtrid", "bqual", "_gid")


# __class__ may change only between classes of the same layout: fail at import, not at begin
assert Xid.__slots__ == _XidParts.__slots__, (Xid.__slots__, _XidParts.__slots__)


def _printable(b: bytes) -> str:
    try:
        s = b.decode("ascii")
        if s.isprintable():
            return s
    except UnicodeDecodeError:
        pass
    return b.hex()
