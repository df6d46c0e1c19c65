"""The recovery manager: finishes what a crash (or an unreachable resource) left in doubt.

One pass (:meth:`RecoveryManager.recover_once`) does what Narayana's and
Atomikos' recovery does, under presumed abort:

* ask every registered resource ``recover()`` for its prepared branches;
* a branch whose global transaction the log says is committing: commit it
  (``XAER_NOTA`` means an earlier attempt did; count it as done);
* once every branch of a logged decision is finished, write "done";
* a prepared branch of THIS node that the log does not know: roll it back --
  but only when it is older than ``safety_interval``, so that a transaction
  between its prepare and its decision record is not killed.  Age comes from
  the resource's optional ``prepared_age(xid)`` hint, else from when this
  manager first saw the branch;
* branches of other nodes or other transaction managers: left alone, reported;
* heuristic outcomes: reported, kept in the log until :meth:`forget`;
* commit marks (:mod:`.marks`): a decision kept in a participant's database
  counts like a logged one, and is deleted once carried out.  While a
  database the log names as a keeper of marks cannot be read, no branch of
  this node is presumed aborted (reported as waiting, with the error).

SAFE MODE: when the log reports damage (a record that could not be read,
see :mod:`.log`), a prepared branch of this node that the log does not name
may belong to a commit decision that was in the unreadable bytes.  Presuming
it aborted could undo half of a committed transaction, so it is left prepared
and reported as ``held``; an operator decides it (``wsrm recover --commit /
--rollback``) and then ends safe mode.  Decisions the intact records name are
still carried out.

A pass is idempotent: run twice, the second finds nothing to do.
Transactions still running in the owning :class:`TransactionManager` are
skipped (``in_flight``), so recovery never races the manager's own phase 2.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass, field

from .errors import IllegalStateError, TransactionError
from .log import LogEntry, TransactionLog
from .xa import (
    TMENDRSCAN, TMSTARTRSCAN, XA_HEURCOM, XA_HEURHAZ, XA_HEURRB, XAER_NOTA, XAER_RMERR,
    XAException, XAResource, error_name,
)
from .xid import Xid

__all__ = ["RecoveryManager", "RecoveryReport", "InDoubt"]

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What one recovery pass saw and did."""

    committed: list[Xid] = field(default_factory=list)
    rolled_back: list[Xid] = field(default_factory=list)
    done: list[Xid] = field(default_factory=list)        # decisions now finished ("done" logged)
    unfinished: list[Xid] = field(default_factory=list)  # decisions with branches still to commit
    waiting: list[Xid] = field(default_factory=list)     # ours, unlogged, within the safety interval
    held: list[Xid] = field(default_factory=list)        # ours, unlogged, log damaged: operator decides
    foreign: list[Xid] = field(default_factory=list)     # another TM's branches: not touched
    heuristics: list[tuple[Xid, int]] = field(default_factory=list)  # in the log, not forgotten
    forgotten: list[Xid] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def acted(self) -> bool:
        """True when the pass changed anything (a second pass should not)."""
        return bool(self.committed or self.rolled_back or self.done or self.forgotten)

    def summary(self) -> str:
        parts = [f"{name}={len(value)}" for name, value in vars(self).items() if value]
        return ", ".join(parts) or "nothing in doubt"


@dataclass(frozen=True)
class InDoubt:
    """A branch an operator may have to look at.

    ``decision`` is what the log says: "commit", "heuristic XA_HEUR*",
    or "none" (presumed abort for our branches; not ours to decide for
    foreign ones).  ``age`` is seconds since prepare (or since first seen).
    """

    xid: Xid
    resource_name: str
    decision: str
    age: float | None
    ours: bool


class _Scan:
    """One pass over the resources' ``recover()`` answers."""

    def __init__(self) -> None:
        self.holders: dict[Xid, XAResource] = {}   # branch -> a resource that holds it
        self.by_name: dict[str, set[Xid]] = {}     # resource name -> branches it holds
        self.failed: dict[str, str] = {}           # resource name -> why recover() failed


@dataclass
class _Marks:
    """The commit marks read in one pass (see :mod:`.marks`)."""

    sources: frozenset[str]                                   # databases the log names
    answered: set[str] = field(default_factory=set)           # ... whose marks were read
    holders: dict[Xid, XAResource] = field(default_factory=dict)  # gxid -> where its mark is


class RecoveryManager:
    """Periodically (or on demand) resolves in-doubt branches from the log.

    ``resources`` may be a list the caller keeps adding to (the transaction
    manager's registered resources).  ``node`` is the node whose unlogged
    branches may be presumed aborted.  ``in_flight`` returns the gtrids of
    transactions still running in this process (never touched).
    """

    def __init__(self, log: TransactionLog, resources: Sequence[XAResource], node: str,
                 safety_interval: float = 60.0, *,
                 in_flight: Callable[[], set[bytes]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self._resources = resources
        self.node = node
        self.safety_interval = safety_interval
        self._in_flight = in_flight or set
        self._clock = clock
        self._first_seen: dict[Xid, float] = {}
        #: passes run so far; a resource registered after the first one gets a pass of its own
        self.passes = 0
        self._run_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def register_resource(self, resource: XAResource) -> None:
        if not any(r is resource for r in self._resources):
            if not isinstance(self._resources, MutableSequence):
                self._resources = list(self._resources)
            self._resources.append(resource)

    # -- one pass -----------------------------------------------------------------

    def recover_once(self, forget_heuristics: bool = False) -> RecoveryReport:
        """Resolve what can be resolved now; see the module docstring."""
        with self._run_lock:
            report = RecoveryReport()
            damaged = bool(_damage(self.log))
            scan = self._scan(report)
            # Read the running set and the log AFTER the scan: a branch seen
            # prepared belongs to a transaction that is either still running
            # now, or finished -- and then its decision is in the log.
            in_flight = self._in_flight()
            pending, marks = self._decisions(report)
            unread = marks.sources - marks.answered
            finished: set[Xid] = set()
            for xid, resource in scan.holders.items():
                gxid = xid.global_xid()
                if gxid.gtrid in in_flight:
                    continue
                entry = pending.get(gxid)
                if entry is not None and xid in entry.heuristics:
                    continue  # reported from the log below
                if entry is not None and entry.committing and _decided(entry, xid):
                    if self._complete(resource, xid, True, report) != "failed":
                        finished.add(xid)
                    continue
                # A branch the decision does not name (a failed or speculative
                # attempt of a job decided with commit_prepared) is presumed aborted.
                if not xid.is_ours(self.node):
                    report.foreign.append(xid)
                    continue
                if damaged:
                    report.held.append(xid)
                    continue
                if self._age(resource, xid) < self.safety_interval:
                    report.waiting.append(xid)
                    continue
                if unread:  # a mark there may have decided it: presume nothing yet
                    report.waiting.append(xid)
                    continue
                self._complete(resource, xid, False, report)
            for gxid, entry in pending.items():
                if entry.committing and gxid.gtrid not in in_flight:
                    self._finish_decision(entry, scan, finished, report, marks.holders.get(gxid))
            for xid in list(self._first_seen):
                if xid not in scan.holders:
                    del self._first_seen[xid]
            for gxid, entry in self.log.pending().items():
                report.heuristics.extend(entry.heuristics.items())
                if forget_heuristics and entry.heuristics:
                    try:
                        self._forget(gxid, entry, scan)
                        report.forgotten.append(gxid)
                    except TransactionError as e:
                        report.errors.append(str(e))
            if report.acted or report.errors or report.heuristics or report.held:
                log.info("recovery pass: %s", report.summary())
            self.passes += 1
            return report

    def _scan(self, report: RecoveryReport | None = None) -> _Scan:
        scan = _Scan()
        distinct: list[tuple[XAResource, set[Xid]]] = []
        for resource in list(self._resources):
            name = _name(resource)
            twin = next((held for r, held in distinct if _same_rm(r, resource)), None)
            if twin is not None:
                scan.by_name.setdefault(name, set()).update(twin)
                continue
            try:
                held = set(resource.recover(TMSTARTRSCAN | TMENDRSCAN))
            except Exception as e:  # noqa: BLE001 -- one resource down must not stop the rest
                scan.failed[name] = str(e)
                if report is not None:
                    report.errors.append(f"recover() on {name} failed: {e}")
                continue
            distinct.append((resource, held))
            scan.by_name.setdefault(name, set()).update(held)
            for xid in held:
                scan.holders.setdefault(xid, resource)
        return scan

    def _complete(self, resource: XAResource, xid: Xid, commit: bool,
                  report: RecoveryReport) -> str:
        """Commit or roll back one branch: "done", "heuristic" or "failed"."""
        verb = "commit" if commit else "rollback"
        try:
            if commit:
                resource.commit(xid, False)
            else:
                resource.rollback(xid)
        except XAException as e:
            if e.code == XAER_NOTA or (not commit and e.is_rollback):
                log.info("recovery: %s of %s on %s: already completed (%s)", verb, xid,
                         _name(resource), error_name(e.code))
                return "done"
            if e.code == (XA_HEURCOM if commit else XA_HEURRB):
                _forget_quietly(resource, xid)
                return "done"
            if e.is_heuristic or (commit and (e.is_rollback or e.code == XAER_RMERR)):
                # XAER_RMERR on commit: the RM gave the branch up -- outcome unknown
                code = e.code if e.is_heuristic else XA_HEURRB if e.is_rollback else XA_HEURHAZ
                log.warning("recovery: %s of %s on %s ended heuristically: %s", verb, xid,
                            _name(resource), error_name(code))
                self.log.log_heuristic(xid.global_xid(), xid, code, _name(resource))
                return "heuristic"
            report.errors.append(f"{verb} of {xid} on {_name(resource)} failed: {e}")
            return "failed"
        except Exception as e:  # noqa: BLE001 -- try again next pass
            report.errors.append(f"{verb} of {xid} on {_name(resource)} failed: {e}")
            return "failed"
        log.info("recovery: %s of %s on %s", "committed" if commit else "rolled back", xid,
                 _name(resource))
        (report.committed if commit else report.rolled_back).append(xid)
        return "done"

    def _decisions(self, report: RecoveryReport) -> tuple[dict[Xid, LogEntry], "_Marks"]:
        """The log's pending entries, with the commit marks of the registered databases
        merged in (a mark is a commit decision like a logged one)."""
        pending = self.log.pending()
        marks = _Marks(_mark_sources(self.log))
        asked: set[str] = set()
        # Every registered database that can keep marks is read (a log kept in memory forgets
        # which ones did); the ones the log names must answer before anything is presumed.
        for resource in list(self._resources):
            database = getattr(resource, "database", None)
            read = getattr(resource, "commit_marks", None)
            if database is None or database in asked or not callable(read):
                continue
            asked.add(database)
            try:
                found = read(self.node)
            except Exception as e:  # noqa: BLE001 -- then nothing of ours is presumed aborted
                if database in marks.sources:
                    report.errors.append(f"cannot read the commit marks in {database} (so no branch "
                                         f"of node {self.node} is presumed aborted): {e}")
                else:
                    log.debug("recovery: cannot read commit marks in %s: %s", database, e)
                continue
            marks.answered.add(database)
            for gxid, entry in found.items():
                marks.holders[gxid] = resource
                logged = pending.get(gxid)
                pending[gxid] = entry if logged is None else LogEntry(
                    gxid, entry.branches, True, logged.heuristics, entry.logged_at)
        for database in sorted(marks.sources - asked):
            report.errors.append(
                f"the recovery log says {database} may hold commit marks of node {self.node}, but "
                "no registered resource reads that database: register it (wsrm recover --dsn) "
                "before any branch of the node can be presumed aborted")
        return pending, marks

    def _finish_decision(self, entry: LogEntry, scan: _Scan, finished: set[Xid],
                         report: RecoveryReport, mark_holder: XAResource | None = None) -> None:
        """Write "done" (or delete the commit mark) when no branch of the decision is left
        prepared anywhere."""
        waiting_for = []
        for bxid, name in entry.branches:
            if bxid in finished or bxid in entry.heuristics:
                continue
            held = scan.by_name.get(name)
            if held is None:
                why = scan.failed.get(name, "it is not registered with the recovery manager")
                waiting_for.append(f"{bxid} on {name} ({why})")
            elif bxid in held:
                waiting_for.append(f"{bxid} on {name} (still prepared)")
        if waiting_for:
            report.unfinished.append(entry.gxid)
            log.warning("recovery: transaction %s is decided commit but waits for %s",
                        entry.gxid, "; ".join(waiting_for))
            return
        if mark_holder is not None:
            try:
                mark_holder.delete_marks([entry.gxid])  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 -- deleted by a later pass
                report.errors.append(f"cannot delete the commit mark of {entry.gxid}: {e}")
                return
        if self.log.is_pending(entry.gxid):
            self.log.log_done(entry.gxid)
        report.done.append(entry.gxid)

    def _age(self, resource: XAResource, xid: Xid) -> float:
        hint = getattr(resource, "prepared_age", None)
        if callable(hint):
            try:
                age = hint(xid)
            except Exception as e:  # noqa: BLE001 -- fall back on our own clock
                log.debug("prepared_age(%s) on %s failed: %s", xid, _name(resource), e)
                age = None
            if age is not None:
                return age
        now = self._clock()
        return now - self._first_seen.setdefault(xid, now)

    # -- heuristics and operators ----------------------------------------------------

    def forget(self, xid: Xid) -> bool:
        """Forget the heuristic outcomes of ``xid``'s global transaction (in the
        resources and in the log) once an operator has dealt with them.
        Returns False when the log has no heuristic for it."""
        gxid = xid.global_xid()
        entry = self.log.pending().get(gxid)
        if entry is None or not entry.heuristics:
            return False
        with self._run_lock:
            self._forget(gxid, entry, self._scan())
        return True

    def _forget(self, gxid: Xid, entry: LogEntry, scan: _Scan) -> None:
        for bxid in entry.heuristics:
            resource = scan.holders.get(bxid)
            if resource is None:
                continue  # the resource no longer remembers it (or is not reachable)
            try:
                resource.forget(bxid)
            except XAException as e:
                if e.code != XAER_NOTA:
                    raise TransactionError(f"forget of {bxid} on {_name(resource)} failed: "
                                           f"{e}; try again later") from e
        self.log.forget(gxid)
        log.info("recovery: forgot heuristic outcome of %s", gxid)

    def in_doubt(self, errors: list[str] | None = None) -> list[InDoubt]:
        """Every branch prepared in a registered resource, and every logged branch
        whose resource cannot be asked, with what the log says about it.
        Resources that could not be asked are added to ``errors`` when given (an
        empty answer is then not "nothing in doubt")."""
        with self._run_lock:
            return self._in_doubt(errors)

    def _in_doubt(self, errors: list[str] | None = None) -> list[InDoubt]:
        report = RecoveryReport()
        scan = self._scan(report)
        pending, _marks = self._decisions(report)
        if errors is not None:
            errors.extend(report.errors)
        damaged = bool(_damage(self.log))
        out: list[InDoubt] = []
        for xid, resource in scan.holders.items():
            entry = pending.get(xid.global_xid())
            ours = xid.is_ours(self.node)
            decision = _decision(entry, xid)
            if decision == "none" and ours and damaged:
                decision = "unknown (recovery log damaged: safe mode, the operator decides)"
            out.append(InDoubt(xid, _name(resource), decision, self._age(resource, xid), ours))
        for entry in pending.values():
            for bxid, name in entry.branches:
                if name in scan.by_name or bxid in scan.holders:
                    continue
                age = time.time() - entry.logged_at if entry.logged_at else None
                out.append(InDoubt(bxid, name, _decision(entry, bxid) + " (resource unreachable)",
                                   age, bxid.is_ours(self.node)))
        return out

    def resolve(self, xid: Xid, commit: bool) -> str:
        """An operator's decision for one in-doubt branch.  Returns "committed",
        "rolled back" or "heuristic"; raises when no resource holds the branch."""
        with self._run_lock:
            scan = self._scan()
            resource = scan.holders.get(xid)
            if resource is None:
                raise IllegalStateError(f"{xid} is not prepared in any registered resource")
            gxid = xid.global_xid()
            pending, marks = self._decisions(RecoveryReport())
            entry = pending.get(gxid)
            logged_commit = entry is not None and entry.committing and _decided(entry, xid)
            if logged_commit != commit:
                log.warning("operator decides to %s %s although the log says %s",
                            "commit" if commit else "roll back", xid,
                            "commit" if logged_commit else "nothing (presumed abort)")
            report = RecoveryReport()
            outcome = self._complete(resource, xid, commit, report)
            if outcome == "failed":
                raise TransactionError("; ".join(report.errors))
            if logged_commit and entry is not None:
                if not commit and outcome == "done":
                    self.log.log_heuristic(gxid, xid, XA_HEURRB, _name(resource))
                self._finish_decision(entry, scan, {xid}, report, marks.holders.get(gxid))
            if outcome == "heuristic":
                return outcome
            return "committed" if commit else "rolled back"

    # -- background ----------------------------------------------------------------

    def start(self, interval: float = 30.0) -> None:
        """Run a pass now and then every ``interval`` seconds in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            raise IllegalStateError("recovery is already running")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval,),
                                        name=f"tx-recovery-{self.node}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the background thread (waits for a running pass to end)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def close(self) -> None:
        """Stop the background thread and close the log.  For a stand-alone
        recovery manager (an operator tool); a TransactionManager closes its own."""
        self.stop()
        self.log.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self, interval: float) -> None:
        while not self._stop.is_set():
            try:
                self.recover_once()
            except Exception:  # noqa: BLE001 -- keep recovering
                log.exception("recovery pass failed")
            if self._stop.wait(interval):
                break


def _damage(log_: TransactionLog) -> list[str]:
    """The log's damage report (a log without one is taken as sound)."""
    damaged = getattr(log_, "damaged", None)
    return list(damaged()) if callable(damaged) else []


def _mark_sources(log_: TransactionLog) -> frozenset[str]:
    """The databases that may hold commit marks (a log that does not know of marks: none)."""
    sources = getattr(log_, "mark_sources", None)
    return frozenset(sources()) if callable(sources) else frozenset()


def _decision(entry: LogEntry | None, xid: Xid) -> str:
    if entry is not None and xid in entry.heuristics:
        return f"heuristic {error_name(entry.heuristics[xid])}"
    if entry is not None and entry.committing and _decided(entry, xid):
        return "commit"
    return "none"


def _decided(entry: LogEntry, xid: Xid) -> bool:
    """True when the commit decision names this branch (a log without branch
    names -- none is written so -- is taken to cover the whole transaction)."""
    return not entry.branches or any(bxid == xid for bxid, _ in entry.branches)


def _name(resource: object) -> str:
    return getattr(resource, "resource_name", None) or type(resource).__name__


def _same_rm(a: XAResource, b: XAResource) -> bool:
    try:
        return bool(a.is_same_rm(b))
    except Exception:  # noqa: BLE001
        return False


def _forget_quietly(resource: XAResource, xid: Xid) -> None:
    try:
        resource.forget(xid)
    except Exception as e:  # noqa: BLE001 -- a harmless leftover in the resource
        log.info("forget of %s on %s failed: %s", xid, _name(resource), e)
