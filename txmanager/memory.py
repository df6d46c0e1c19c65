"""An in-memory XA resource: a small transactional key-value store.

It is a real resource manager, not a mock: work done while a connection
(:class:`MemoryResource`) is associated with a branch is staged for that
branch, writes take exclusive key locks held until the branch ends, prepare
validates and keeps the staged changes (a branch with no writes votes
read-only), commit applies them, rollback drops them.  Its prepared branches
live in memory only, so it is a *volatile* participant: it survives a crash of
the transaction manager (the store object stays alive in a test) but not of
its own process.

Knobs on :class:`MemoryResource` inject the failures a real resource shows, so
that every path of the protocol can be driven:

* ``vote_no`` -- prepare rolls the branch back and raises ``XA_RBROLLBACK``;
* ``prepare_error`` -- prepare raises this XA code and changes nothing;
* ``prepare_delay`` -- prepare blocks this many seconds before voting;
* ``commit_failures`` / ``rollback_failures`` -- the next N calls raise
  ``XAER_RMFAIL`` and change nothing (a resource briefly unreachable);
* ``heuristic_on_commit`` / ``heuristic_on_rollback`` -- the branch is completed
  heuristically with that XA_HEUR* code and remembered until ``forget``;
* ``down`` -- every XA call raises ``XAER_RMFAIL``.

``history`` records every XA call as ``(method, xid, flags)`` so a test can
check which flags the transaction manager used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .xa import (
    TMFAIL, TMJOIN, TMNOFLAGS, TMONEPHASE, TMRESUME, TMSTARTRSCAN, TMSUCCESS, TMSUSPEND,
    XA_HEURCOM, XA_HEURHAZ, XA_HEURMIX, XA_HEURRB, XA_OK, XA_RBINTEGRITY, XA_RBROLLBACK,
    XA_RBTIMEOUT, XA_RDONLY, XAER_DUPID, XAER_INVAL, XAER_NOTA, XAER_PROTO, XAER_RMFAIL,
    XAException,
)
from .xid import Xid

__all__ = ["MemoryStore", "MemoryResource", "KeyLockedError"]

_DELETED = object()
_ACTIVE, _PREPARED, _HEURISTIC = "active", "prepared", "heuristic"


class KeyLockedError(RuntimeError):
    """The key is written by another, unfinished branch (no waiting: no deadlocks)."""

    def __init__(self, key: str, owner: Xid) -> None:
        super().__init__(f"key {key!r} is locked by branch {owner}; retry after it completes")
        self.key = key
        self.owner = owner


@dataclass
class _Branch:
    xid: Xid
    started_at: float
    expires_at: float | None
    writes: dict[str, Any] = field(default_factory=dict)
    state: str = _ACTIVE
    associations: int = 0          # connections currently associated (active or suspended)
    rollback_code: int | None = None  # set when the branch can only roll back
    prepared_at: float | None = None
    heuristic: int | None = None


class MemoryStore:
    """The resource manager: committed data, open branches, key locks.

    Several :class:`MemoryResource` connections may share one store; they are
    then the same resource manager (``is_same_rm``) and can join one branch.
    """

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self.mutex = threading.RLock()
        self._data: dict[str, Any] = dict(data or {})
        self._branches: dict[Xid, _Branch] = {}
        self._locks: dict[str, Xid] = {}

    def snapshot(self) -> dict[str, Any]:
        """A copy of the committed data."""
        with self.mutex:
            return dict(self._data)

    def branch_xids(self) -> list[Xid]:
        """Every branch the store knows (active, prepared or heuristic)."""
        with self.mutex:
            return list(self._branches)

    def branch_state(self, xid: Xid) -> str | None:
        """"active", "prepared", "heuristic" or None for an unknown branch."""
        with self.mutex:
            b = self._branches.get(xid)
            return b.state if b else None

    def locked_keys(self) -> dict[str, Xid]:
        with self.mutex:
            return dict(self._locks)

    # -- used by MemoryResource, under self.mutex --------------------------------

    def _drop(self, branch: _Branch) -> None:
        self._release(branch)
        self._branches.pop(branch.xid, None)

    def _release(self, branch: _Branch) -> None:
        for key in branch.writes:
            if self._locks.get(key) == branch.xid:
                del self._locks[key]

    def _apply(self, branch: _Branch, keys: list[str] | None = None) -> None:
        for key in branch.writes if keys is None else keys:
            value = branch.writes[key]
            if value is _DELETED:
                self._data.pop(key, None)
            else:
                self._data[key] = value

    def _after_image(self, branch: _Branch) -> dict[str, Any]:
        image = dict(self._data)
        for key, value in branch.writes.items():
            if value is _DELETED:
                image.pop(key, None)
            else:
                image[key] = value
        return image


class MemoryResource:
    """A connection to a :class:`MemoryStore`, and the XA resource for it.

    ``put``/``get``/``delete`` act inside the branch this connection is
    associated with (between ``start`` and ``end``), or directly on committed
    data (autocommit) when it is associated with none.  ``constraint`` is
    called at prepare with the data as it would be after commit; returning
    False votes no (``XA_RBINTEGRITY``).
    """

    def __init__(self, resource_name: str = "memory", store: MemoryStore | None = None, *,
                 constraint: Callable[[Mapping[str, Any]], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.resource_name = resource_name
        self.store = store if store is not None else MemoryStore()
        self.constraint = constraint
        self.clock = clock
        self.history: list[tuple[str, Xid | None, int]] = []
        self._timeout = 0
        self._current: Xid | None = None
        self._suspended: set[Xid] = set()
        # failure injection
        self.vote_no = False
        self.prepare_error: int | None = None
        self.prepare_delay = 0.0
        self.commit_failures = 0
        self.rollback_failures = 0
        self.heuristic_on_commit: int | None = None
        self.heuristic_on_rollback: int | None = None
        self.down = False

    def __repr__(self) -> str:
        return f"MemoryResource({self.resource_name!r})"

    # -- the application's side ----------------------------------------------------

    def put(self, key: str, value: Any) -> None:
        self._write(key, value)

    def delete(self, key: str) -> None:
        self._write(key, _DELETED)

    def get(self, key: str, default: Any = None) -> Any:
        """Committed data, seen through this branch's own uncommitted writes."""
        with self.store.mutex:
            if self._current is not None:
                branch = self.store._branches.get(self._current)
                if branch is not None and key in branch.writes:
                    value = branch.writes[key]
                    return default if value is _DELETED else value
            return self.store._data.get(key, default)

    def snapshot(self) -> dict[str, Any]:
        return self.store.snapshot()

    @property
    def current_xid(self) -> Xid | None:
        """The branch this connection is associated with, if any."""
        return self._current

    def _write(self, key: str, value: Any) -> None:
        store = self.store
        with store.mutex:
            owner = store._locks.get(key)
            if self._current is None:
                if owner is not None:
                    raise KeyLockedError(key, owner)
                if value is _DELETED:
                    store._data.pop(key, None)
                else:
                    store._data[key] = value
                return
            branch = store._branches.get(self._current)
            if branch is None:
                raise XAException(XAER_NOTA, f"branch {self._current} no longer exists")
            if owner is not None and owner != branch.xid:
                raise KeyLockedError(key, owner)
            store._locks[key] = branch.xid
            branch.writes[key] = value

    # -- XAResource ----------------------------------------------------------------

    def start(self, xid: Xid, flags: int = TMNOFLAGS) -> None:
        self._called("start", xid, flags)
        if flags not in (TMNOFLAGS, TMJOIN, TMRESUME):
            raise XAException(XAER_INVAL, f"start flags {flags:#x} are not TMNOFLAGS/TMJOIN/TMRESUME")
        store = self.store
        with store.mutex:
            if self._current is not None:
                raise XAException(XAER_PROTO, f"connection is already associated with {self._current}; "
                                  "end() it first")
            branch = store._branches.get(xid)
            if flags == TMNOFLAGS:
                if branch is not None:
                    raise XAException(XAER_DUPID, f"branch {xid} already exists; use TMJOIN to join it")
                now = self.clock()
                branch = _Branch(xid, now, now + self._timeout if self._timeout > 0 else None)
                store._branches[xid] = branch
            elif flags == TMJOIN:
                if branch is None:
                    raise XAException(XAER_NOTA, f"cannot join unknown branch {xid}")
                if branch.state != _ACTIVE:
                    raise XAException(XAER_PROTO, f"cannot join branch {xid}: it is {branch.state}")
                if branch.rollback_code is not None:
                    raise XAException(branch.rollback_code, f"branch {xid} is rollback-only")
            else:  # TMRESUME
                if xid not in self._suspended or branch is None:
                    raise XAException(XAER_PROTO, f"branch {xid} is not suspended on this connection")
                self._suspended.discard(xid)
                branch.associations -= 1
            branch.associations += 1
            self._current = xid

    def end(self, xid: Xid, flags: int = TMSUCCESS) -> None:
        self._called("end", xid, flags)
        if flags not in (TMSUCCESS, TMFAIL, TMSUSPEND):
            raise XAException(XAER_INVAL, f"end flags {flags:#x} are not TMSUCCESS/TMFAIL/TMSUSPEND")
        store = self.store
        with store.mutex:
            suspended = xid in self._suspended
            if self._current != xid and not (suspended and flags != TMSUSPEND):
                raise XAException(XAER_PROTO, f"connection is not associated with {xid}")
            branch = store._branches.get(xid)
            if flags == TMSUSPEND:
                self._suspended.add(xid)
                self._current = None
                return
            if suspended:
                self._suspended.discard(xid)
            else:
                self._current = None
            if branch is None:
                raise XAException(XAER_NOTA, f"branch {xid} no longer exists")
            branch.associations -= 1
            if flags == TMFAIL and branch.rollback_code is None:
                branch.rollback_code = XA_RBROLLBACK
            elif branch.rollback_code is not None:
                raise XAException(branch.rollback_code, f"branch {xid} is rollback-only")

    def prepare(self, xid: Xid) -> int:
        self._called("prepare", xid, TMNOFLAGS)
        if self.prepare_error is not None:
            raise XAException(self.prepare_error, "injected prepare failure")
        with self.store.mutex:
            self._idle_branch(xid)  # protocol checks before blocking
        if self.prepare_delay:
            time.sleep(self.prepare_delay)
        store = self.store
        with store.mutex:
            branch = self._idle_branch(xid)
            self._validate(branch)
            if not branch.writes:
                store._drop(branch)
                return XA_RDONLY
            branch.state = _PREPARED
            branch.prepared_at = self.clock()
            return XA_OK

    def commit(self, xid: Xid, one_phase: bool = False) -> None:
        self._called("commit", xid, TMONEPHASE if one_phase else TMNOFLAGS)
        if self.commit_failures > 0:
            self.commit_failures -= 1
            raise XAException(XAER_RMFAIL, "injected commit failure")
        store = self.store
        with store.mutex:
            branch = self._known(xid)
            if branch.heuristic is not None:  # completed heuristically (state _HEURISTIC)
                raise XAException(branch.heuristic, f"branch {xid} was completed heuristically")
            if one_phase:
                branch = self._idle_branch(xid)
                self._validate(branch)
            elif branch.state != _PREPARED:
                raise XAException(XAER_PROTO, f"branch {xid} is not prepared; commit(one_phase=True) "
                                  "or prepare() it first")
            if self.heuristic_on_commit is not None:
                self._complete_heuristically(branch, self.heuristic_on_commit)
            store._apply(branch)
            store._drop(branch)

    def rollback(self, xid: Xid) -> None:
        self._called("rollback", xid, TMNOFLAGS)
        if self.rollback_failures > 0:
            self.rollback_failures -= 1
            raise XAException(XAER_RMFAIL, "injected rollback failure")
        store = self.store
        with store.mutex:
            branch = self._known(xid)
            if branch.heuristic is not None:  # completed heuristically (state _HEURISTIC)
                raise XAException(branch.heuristic, f"branch {xid} was completed heuristically")
            if branch.associations:
                raise XAException(XAER_PROTO, f"branch {xid} is still associated; end() it first")
            if self.heuristic_on_rollback is not None:
                self._complete_heuristically(branch, self.heuristic_on_rollback)
            store._drop(branch)

    def recover(self, flags: int = TMSTARTRSCAN) -> list[Xid]:
        self._called("recover", None, flags)
        if not flags & TMSTARTRSCAN:
            return []  # the whole list was returned at the start of the scan
        with self.store.mutex:
            return [b.xid for b in self.store._branches.values() if b.state != _ACTIVE]

    def forget(self, xid: Xid) -> None:
        self._called("forget", xid, TMNOFLAGS)
        with self.store.mutex:
            branch = self._known(xid)
            if branch.state != _HEURISTIC:
                raise XAException(XAER_PROTO, f"branch {xid} was not completed heuristically")
            del self.store._branches[xid]

    def is_same_rm(self, other: object) -> bool:
        return isinstance(other, MemoryResource) and other.store is self.store

    def get_transaction_timeout(self) -> int:
        return self._timeout

    def set_transaction_timeout(self, seconds: int) -> bool:
        if seconds < 0:
            raise XAException(XAER_INVAL, f"timeout {seconds} is negative")
        self._timeout = int(seconds)
        return True

    def prepared_age(self, xid: Xid) -> float | None:
        """Seconds since ``xid`` was prepared (the recovery manager's safety-interval hint)."""
        with self.store.mutex:
            b = self.store._branches.get(xid)
            if b is None or b.prepared_at is None:
                return None
            return self.clock() - b.prepared_at

    # -- helpers ---------------------------------------------------------------------

    def _called(self, method: str, xid: Xid | None, flags: int) -> None:
        self.history.append((method, xid, flags))
        if self.down:
            raise XAException(XAER_RMFAIL, f"resource {self.resource_name} is down")

    def _known(self, xid: Xid) -> _Branch:
        branch = self.store._branches.get(xid)
        if branch is None:
            raise XAException(XAER_NOTA, f"unknown branch {xid}")
        return branch

    def _idle_branch(self, xid: Xid) -> _Branch:
        """The branch, checked to be active and ended (no connection associated)."""
        branch = self._known(xid)
        if branch.state != _ACTIVE:
            raise XAException(XAER_PROTO, f"branch {xid} is already {branch.state}")
        if branch.associations:
            raise XAException(XAER_PROTO, f"branch {xid} is still associated; end() it first")
        return branch

    def _validate(self, branch: _Branch) -> None:
        """Vote: roll the branch back and raise XA_RB* if it cannot commit."""
        code = branch.rollback_code
        if code is None and branch.expires_at is not None and self.clock() > branch.expires_at:
            code = XA_RBTIMEOUT
        if code is None and self.vote_no:
            code = XA_RBROLLBACK
        if code is None and self.constraint is not None and branch.writes:
            if not self.constraint(self.store._after_image(branch)):
                code = XA_RBINTEGRITY
        if code is not None:
            self.store._drop(branch)
            raise XAException(code, f"branch {branch.xid} cannot commit")

    def _complete_heuristically(self, branch: _Branch, code: int) -> None:
        """Decide the branch on our own, remember it until forget(), and say so."""
        if code == XA_HEURCOM:
            self.store._apply(branch)
        elif code == XA_HEURMIX:
            keys = sorted(branch.writes)
            self.store._apply(branch, keys[: max(1, len(keys) // 2)])
        elif code not in (XA_HEURRB, XA_HEURHAZ):
            raise ValueError(f"{code} is not an XA_HEUR* code")
        self.store._release(branch)
        branch.state = _HEURISTIC
        branch.heuristic = code
        raise XAException(code, f"branch {branch.xid} completed heuristically")
