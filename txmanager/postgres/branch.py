"""A branch on one PostgreSQL session: its XA state, the statements that begin, prepare,
commit and roll it back, and the SQLSTATEs that say how a failure left it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lazy_begin import LazyBeginConnection, psycopg_xid
from ..xa import (
    XA_RBCOMMFAIL,
    XA_RBDEADLOCK,
    XA_RBINTEGRITY,
    XA_RBOTHER,
    XA_RBROLLBACK,
    XA_RBTIMEOUT,
    XA_RBTRANSIENT,
)
from ..xid import Xid
from .server import Connection


class _State:
    """A branch's XA state on its session.

    Plain string constants rather than an Enum: on Python 3.11 reading an
    Enum member costs seven times a class attribute, and the states are read
    several times per transaction.
    """

    ACTIVE = "active"            # associated with the caller: SQL may run
    SUSPENDED = "suspended"      # end(TMSUSPEND): may resume
    IDLE = "idle"                # end(TMSUCCESS): may prepare, commit one-phase or join
    ROLLBACK_ONLY = "rollback-only"  # end(TMFAIL) or a failed statement
    PREPARED = "prepared"


class _Branch:
    """The session's branch: its xid and its XA state."""

    __slots__ = ("xid", "state")

    def __init__(self, xid: Xid, state: str) -> None:
        self.xid = xid
        self.state = state


@dataclass(frozen=True)
class _Ended:
    """A branch this resource gave up on its own (lost session, a 'no' vote).

    Remembered so the transaction manager's follow-up ``rollback`` succeeds
    without touching the server, and a ``commit`` says why it cannot.
    """

    code: int
    maybe_prepared: bool


_MAX_ENDED = 64

# SQLSTATEs of the failures that end a session rather than a statement.
_SESSION_GONE = ("57P01", "57P02", "57P03", "25P03")


def _rollback_code(pgcode: str | None) -> int:
    """The XA_RB* code for a transaction PostgreSQL refused (and so rolled back)."""
    if not pgcode:
        return XA_RBOTHER
    if pgcode == "40P01":
        return XA_RBDEADLOCK
    if pgcode == "40001":
        return XA_RBTRANSIENT  # serialization failure: retrying the transaction may succeed
    if pgcode.startswith("40"):
        return XA_RBROLLBACK
    if pgcode.startswith("23"):
        return XA_RBINTEGRITY
    if pgcode in ("57014", "55P03", "25P03"):
        return XA_RBTIMEOUT  # statement_timeout, lock_timeout, idle_in_transaction timeout
    if pgcode.startswith("08"):
        return XA_RBCOMMFAIL
    return XA_RBOTHER


def _begin_branch(conn: Connection, xid: Xid) -> None:
    if isinstance(conn, LazyBeginConnection):
        conn.begin_branch(xid)
    else:
        conn.tpc_begin(psycopg_xid(xid))


def _commit_branch(conn: Connection) -> None:
    """COMMIT (one phase) or COMMIT PREPARED (prepared on this session) of the session's branch."""
    if isinstance(conn, LazyBeginConnection):
        conn.commit_branch()
    else:
        conn.tpc_commit()


def _prepare_branch(conn: Connection) -> None:
    if isinstance(conn, LazyBeginConnection):
        conn.prepare_branch()
    else:
        conn.tpc_prepare()


def _rollback_branch(conn: Connection) -> None:
    if isinstance(conn, LazyBeginConnection):
        conn.rollback_branch()
    else:
        conn.tpc_rollback()
