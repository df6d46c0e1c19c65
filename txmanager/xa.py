"""The XA resource contract between the transaction manager and resource managers.

This is the X/Open XA interface as JTA shaped it (``javax.transaction.xa``):
the transaction manager calls ``start``/``end`` around the work a branch does,
then ``prepare`` and ``commit`` or ``rollback``; ``recover`` lists the branches a
resource holds prepared after a crash.  Keeping the names and codes of the
standard means a reader who knows Narayana, Atomikos or a JDBC XA driver knows
this too, and the codes in an :class:`XAException` mean what they mean there.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .xid import Xid

__all__ = [
    "TMNOFLAGS", "TMJOIN", "TMENDRSCAN", "TMSTARTRSCAN", "TMSUSPEND", "TMSUCCESS",
    "TMRESUME", "TMFAIL", "TMONEPHASE",
    "XA_OK", "XA_RDONLY", "XA_RETRY", "XA_HEURMIX", "XA_HEURRB", "XA_HEURCOM",
    "XA_HEURHAZ", "XA_NOMIGRATE",
    "XA_RBBASE", "XA_RBROLLBACK", "XA_RBCOMMFAIL", "XA_RBDEADLOCK", "XA_RBINTEGRITY",
    "XA_RBOTHER", "XA_RBPROTO", "XA_RBTIMEOUT", "XA_RBTRANSIENT", "XA_RBEND",
    "XAER_ASYNC", "XAER_RMERR", "XAER_NOTA", "XAER_INVAL", "XAER_PROTO",
    "XAER_RMFAIL", "XAER_DUPID", "XAER_OUTSIDE",
    "XAException", "XAResource", "error_name",
]

#: What a resource's ``end_and_commit_one_phase(xid, sync)`` answers (rather than True, and true as
#: well; compared by identity) when it
#: committed the branch and also ran ``sync``, the caller's synchronization for it, itself: the
#: session's own return to its pool, which reads nothing of the transaction and so may run before
#: the transaction is marked committed (see PostgresXAResource.end_and_commit_one_phase).
SYNC_RAN = "sync ran"

# Flags (values as in javax.transaction.xa.XAResource).
TMNOFLAGS = 0x00000000
TMJOIN = 0x00200000
TMENDRSCAN = 0x00800000
TMSTARTRSCAN = 0x01000000
TMSUSPEND = 0x02000000
TMSUCCESS = 0x04000000
TMRESUME = 0x08000000
TMFAIL = 0x20000000
TMONEPHASE = 0x40000000

# Return values and heuristic codes.
XA_OK = 0
XA_RDONLY = 3
XA_RETRY = 4
XA_HEURMIX = 5
XA_HEURRB = 6
XA_HEURCOM = 7
XA_HEURHAZ = 8
XA_NOMIGRATE = 9

# Rollback codes: the branch has been (or must be) rolled back.
XA_RBBASE = 100
XA_RBROLLBACK = 100
XA_RBCOMMFAIL = 101
XA_RBDEADLOCK = 102
XA_RBINTEGRITY = 103
XA_RBOTHER = 104
XA_RBPROTO = 105
XA_RBTIMEOUT = 106
XA_RBTRANSIENT = 107
XA_RBEND = 107

# Errors.
XAER_ASYNC = -2
XAER_RMERR = -3
XAER_NOTA = -4
XAER_INVAL = -5
XAER_PROTO = -6
XAER_RMFAIL = -7
XAER_DUPID = -8
XAER_OUTSIDE = -9

_NAMES = {
    value: name
    for name, value in dict(globals()).items()
    if (name.startswith("XA_") or name.startswith("XAER_")) and isinstance(value, int)
    and name not in ("XA_RBBASE", "XA_RBEND")
}


def error_name(code: int) -> str:
    """The X/Open name of an XA code (``XAER_NOTA`` for -4), for messages and logs."""
    return _NAMES.get(code, f"XA({code})")


class XAException(Exception):
    """A resource manager's answer that is not XA_OK, with its X/Open code.

    ``errorCode`` follows JTA's spelling so code ported from Java reads the same;
    ``code`` is the Pythonic alias.
    """

    def __init__(self, code: int, message: str = "") -> None:
        self.errorCode = code
        self.code = code
        self.message = message
        super().__init__(f"{error_name(code)}: {message}" if message else error_name(code))

    @property
    def is_rollback(self) -> bool:
        """True for XA_RB*: the branch is rolled back (a 'no' vote at prepare)."""
        return XA_RBBASE <= self.code <= XA_RBEND

    @property
    def is_heuristic(self) -> bool:
        return self.code in (XA_HEURMIX, XA_HEURRB, XA_HEURCOM, XA_HEURHAZ)


@runtime_checkable
class XAResource(Protocol):
    """What a resource manager offers the transaction manager (JTA ``XAResource``).

    Implementations raise :class:`XAException` with an X/Open code on failure.
    ``resource_name`` is a stable name (the same after a restart) under which
    the recovery log records the branch, so an operator can tell which resource
    an in-doubt branch lives in.
    """

    resource_name: str

    def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        """Associate the branch with the calling thread (TMNOFLAGS, TMJOIN or TMRESUME)."""

    def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        """Dissociate the branch (TMSUCCESS, TMFAIL or TMSUSPEND)."""

    def prepare(self, xid: Xid) -> int:
        """Vote: XA_OK (prepared, durable) or XA_RDONLY; raise XA_RB* to vote no."""

    def commit(self, xid: Xid, one_phase: bool = False) -> None:
        """Commit a prepared branch, or an unprepared one when ``one_phase``."""

    def rollback(self, xid: Xid) -> None:
        """Roll back the branch, prepared or not."""

    def recover(self, flags: int = TMSTARTRSCAN | TMENDRSCAN) -> list[Xid]:
        """The xids of the branches this resource holds prepared (in doubt)."""

    def forget(self, xid: Xid) -> None:
        """Drop the memory of a heuristically completed branch."""

    def is_same_rm(self, other: "XAResource") -> bool:
        """True when ``other`` reaches the same resource manager (branches may be joined)."""

    def get_transaction_timeout(self) -> int:
        """Seconds, 0 for the resource's default."""

    def set_transaction_timeout(self, seconds: int) -> bool:
        """Returns False when the resource does not support branch timeouts."""
