"""XA branch bookkeeping shared by the stores that implement XA themselves.

The memory and SQLite stores are their own resource managers (PostgreSQL
brings its own, see :mod:`.postgres`).  What they share is the XA association
protocol: ``start``/``end`` with their flags, one store transaction per
branch, the "failed" mark of ``end(TMFAIL)``, and the helper behind
``store.begin(xa=tm)`` that enlists the resource in the caller's current
global transaction and hands back the branch's store transaction.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from typing import Any

from txmanager.xa import (
    TMFAIL, TMJOIN, TMNOFLAGS, TMRESUME, TMSUCCESS, TMSUSPEND, XA_RBROLLBACK, XAER_DUPID,
    XAER_INVAL, XAER_NOTA, XAER_PROTO, XAException,
)
from txmanager.xid import Xid

from . import api

__all__ = ["Branch", "BranchResource"]

log = logging.getLogger(__name__)


class Branch:
    """One branch: its store transaction and where it is in the XA protocol."""

    __slots__ = ("xid", "tx", "active", "rollback_only")

    def __init__(self, xid: Xid, tx: Any) -> None:
        self.xid = xid
        self.tx = tx
        self.active = True
        self.rollback_only = False


class _DrivenBranch:
    """Stands for the global transaction when the caller drives XA by hand."""

    def __init__(self, branch: "Branch") -> None:
        self.xid = branch.xid
        self._branch = branch

    def set_rollback_only(self) -> None:
        self._branch.rollback_only = True


class BranchResource(ABC):
    """The XA verbs up to ``prepare``; subclasses decide what prepare and phase 2 mean.

    Subclasses implement :meth:`_open_branch_tx` (a store transaction for a new
    branch), ``prepare``, ``commit``, ``rollback`` and ``recover``.
    """

    resource_name: str

    def __init__(self, store: api.StorageManager) -> None:
        self._store = store
        self.resource_name = f"wsrm-store:{store.url}"
        self._branches: dict[Xid, Branch] = {}
        self._lock = threading.Lock()

    @abstractmethod
    def _open_branch_tx(self, xid: Xid) -> Any:
        """A store transaction of its own for the new branch ``xid``."""

    # -- store.begin(xa=tm) -------------------------------------------------------------

    def bind_current(self, tm: Any) -> Any:
        """Enlist in ``tm``'s current transaction; that branch's store transaction, or None."""
        get = getattr(tm, "get_transaction", None)
        if get is None:
            raise TypeError(f"xa= expects a txmanager.TransactionManager, not {type(tm).__name__}")
        gtx = get()
        if gtx is None:
            return None
        gtx.enlist_resource(self)
        branch = self._branch_of(gtx.xid)
        if branch is None:
            raise api.StoreError(
                f"the transaction manager enlisted {self.resource_name} in {gtx.xid} but started "
                "no branch on it (start(xid) was not called)")
        branch.tx._global = gtx
        return branch.tx

    def transaction_of(self, xid: Xid) -> Any:
        """The store transaction of an active (started, unprepared) branch.

        For code that drives the XA verbs itself instead of through
        ``store.begin(xa=tm)``; ending it is still the XA verbs' business.
        """
        branch = self._get(xid)
        branch.tx._global = _DrivenBranch(branch)
        return branch.tx

    def _branch_of(self, gxid: Xid) -> Branch | None:
        with self._lock:
            mine = [b for b in self._branches.values()
                    if b.xid.gtrid == gxid.gtrid and b.xid.format_id == gxid.format_id]
        active = [b for b in mine if b.active]
        found = active or mine
        return found[-1] if found else None

    def _get(self, xid: Xid) -> Branch:
        with self._lock:
            branch = self._branches.get(xid)
        if branch is None:
            raise XAException(XAER_NOTA, f"{self.resource_name} has no active branch {xid}")
        return branch

    def _pop(self, xid: Xid) -> Branch | None:
        with self._lock:
            return self._branches.pop(xid, None)

    def _abort(self, branch: Branch) -> None:
        self._pop(branch.xid)
        if not branch.tx.closed:
            self._store_finish(branch.tx, commit=False)

    @abstractmethod
    def _store_finish(self, tx: Any, commit: bool) -> None:
        """End a branch's store transaction (commit or roll back) and release what it held."""

    def _refuse_failed(self, branch: Branch) -> None:
        failed = getattr(branch.tx, "failed", None)
        if branch.rollback_only or failed is not None:
            self._abort(branch)
            why = f"a step of it failed ({failed})" if failed is not None else "it was marked failed"
            raise XAException(XA_RBROLLBACK, f"branch {branch.xid} cannot commit: {why}")

    # -- XAResource: association --------------------------------------------------------

    def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        if flags in (TMJOIN, TMRESUME):
            branch = self._get(xid)
            if branch.rollback_only and flags == TMJOIN:
                raise XAException(XA_RBROLLBACK, f"branch {xid} is marked failed and cannot be joined")
            branch.active = True
            return
        if flags != TMNOFLAGS:
            raise XAException(XAER_INVAL, f"start flags {flags:#x}: use TMNOFLAGS, TMJOIN or TMRESUME")
        with self._lock:
            if xid in self._branches:
                raise XAException(XAER_DUPID, f"branch {xid} already exists; use TMJOIN")
        tx = self._open_branch_tx(xid)
        with self._lock:
            self._branches[xid] = Branch(xid, tx)

    def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        if flags not in (TMSUCCESS, TMFAIL, TMSUSPEND):
            raise XAException(XAER_INVAL, f"end flags {flags:#x}: use TMSUCCESS, TMFAIL or TMSUSPEND")
        branch = self._get(xid)
        branch.active = False
        if flags == TMFAIL:
            branch.rollback_only = True

    def forget(self, xid: Xid) -> None:
        raise XAException(XAER_NOTA, f"{self.resource_name} never completes a branch heuristically")

    def is_same_rm(self, other: Any) -> bool:
        """Only this very resource: a branch's work lives in one store transaction object."""
        return other is self

    def get_transaction_timeout(self) -> int:
        return 0

    def set_transaction_timeout(self, seconds: int) -> bool:
        """Not supported: the store's ``lock_timeout`` bounds waits, the TM bounds the rest."""
        return False

    def _protocol_error(self, xid: Xid, why: str) -> XAException:
        return XAException(XAER_PROTO, f"{self.resource_name}: branch {xid} {why}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.resource_name}>"
