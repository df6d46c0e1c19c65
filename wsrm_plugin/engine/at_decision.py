"""Deliveries answered at their commit decision (``RMPolicy.answer_at_decision``), and the
guard that keeps a sequence's deliveries seeing one another's rows.

Under a transaction manager a delivery into the application's own database (not the store's)
commits in two phases: the application's branch is prepared, the store's commits in one
phase with the commit mark (the decision, :mod:`txmanager.marks`), then the application's
``COMMIT PREPARED``.  Once the mark has committed the message is received, taken and
delivered for good (recovery commits the prepared branch should the process die), so the
receive answers then and a worker thread (:mod:`txmanager.phase_two`) sends the
``COMMIT PREPARED``: a round trip and a WAL flush off every message's path.  The leader of a
batch of receives that deliver together (``RMPolicy.receive_together``) runs its batch's phase 2
itself instead, once the batch's other receives were answered, then answers its own
(:meth:`AtDecision.collect_here`): no worker thread to wake.

Until it has run, the application's rows are not visible to other sessions.  The next
message of the same sequence may read what the last one wrote (in order means that too),
so its delivery waits for that phase 2 before the application runs (:meth:`AtDecision.wait_turn`),
in this process; its receipt and take go on meanwhile.  What another reader of the
application's database may see first (the acknowledgement, a reply) is in the concepts page's
crash table.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from txmanager.phase_two import PhaseTwo, PhaseTwoWorkers

__all__ = ["AtDecision", "GUARD_WAIT"]

log = logging.getLogger(__name__)

#: Seconds a delivery waits at most for the phase 2 of its sequence's last delivery (a
#: ``COMMIT PREPARED`` and its retries: far less), then goes on with a warning.
GUARD_WAIT = 60.0

#: Sequences remembered with a phase 2 under way before the finished ones are swept out.
_SWEEP_AT = 256


class AtDecision:
    """The phase-2 workers of one engine's deliveries, and the last pending phase 2 of each
    sequence delivered in this process."""

    def __init__(self, tm: Any, name: str = "wsrm", threads: int = 4) -> None:
        self._tm = tm
        #: (threads named ``<engine>-phase-two-N``)
        self.workers = PhaseTwoWorkers(threads, name=f"{name}-phase-two")
        #: by sequence: the phase 2 of its last delivery, and that delivery's transaction
        self._pending: dict[str, tuple[PhaseTwo, Any]] = {}
        self._lock = threading.Lock()
        #: deliveries waiting now for the phase 2 of their sequence's last one
        self.waiting = 0
        #: ``jobs``: the phases 2 this thread runs itself (:meth:`run_here`), or None: the workers'
        self._here = threading.local()
        self._in_this_thread = _InThisThread(self._here)

    def collect_here(self) -> None:
        """The phases 2 of the deliveries this thread commits from now on are run by this thread,
        at :meth:`run_here`, instead of by the workers.  For the leader of a batch of receives
        that deliver together: it runs its batch's phase 2 once the batch's other receives were
        answered (woken at the decision), then answers its own.  Handed to a worker, each phase
        2 woke a thread, whose round trip and wait for the interpreter were a few more thread
        switches a batch (xa2 at 16 sequences: the workers' threads 1.25-1.53 a message)."""
        self._here.jobs = []

    def run_here(self) -> None:
        """Run the phases 2 collected since :meth:`collect_here` (a failure logged, as a
        worker's), and hand the next ones to the workers again."""
        jobs, self._here.jobs = getattr(self._here, "jobs", None), None
        for job in jobs or ():
            try:
                job()
            except Exception:  # noqa: BLE001 -- as PhaseTwoWorkers: logged, the caller goes on
                log.exception(self.workers.failure)

    def wait_turn(self, sequence_id: str) -> None:
        """Before a delivery of ``sequence_id`` runs its application: wait until the rows of
        the sequence's last delivery are visible (its phase 2 done)."""
        entry = self._pending.get(sequence_id)  # one dict read, atomic
        if entry is None:
            return
        pending, gtx = entry
        if gtx is self._tm.get_transaction():
            return  # an earlier part of this very batch: its rows are this transaction's own
        if not pending.done:
            with self._lock:
                self.waiting += 1
            try:
                finished = pending.wait(GUARD_WAIT)
            finally:
                with self._lock:
                    self.waiting -= 1
            if not finished:
                log.warning("sequence %s: the phase 2 of its last delivery is still under way after %.0f s; "
                            "delivering the next one", sequence_id, GUARD_WAIT)
        with self._lock:
            if self._pending.get(sequence_id) is entry:
                del self._pending[sequence_id]

    def after_delivery(self, sequence_id: str) -> None:
        """A delivery of ``sequence_id`` ran in the calling thread's global transaction: when
        that commits in two phases, its commit returns at the decision, and the sequence's
        next delivery waits for the phase 2 (the same for every delivery of a batch)."""
        gtx = self._tm.get_transaction()
        if gtx is None or gtx.branch_count < 2:
            return  # one branch (the application's database is the store's): one phase, nothing after
        here = self._here.__dict__.get("jobs")
        pending = gtx.commit_at_decision(self.workers if here is None else self._in_this_thread)
        with self._lock:
            self._pending[sequence_id] = (pending, gtx)
            if len(self._pending) > _SWEEP_AT:
                for key in [k for k, (p, _) in self._pending.items() if p.done]:
                    del self._pending[key]

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every phase 2 handed over has run (an engine stopping); True if so."""
        return self.workers.drain(timeout)


class _InThisThread:
    """The workers of a thread that runs its phases 2 itself (:meth:`AtDecision.collect_here`):
    a job is kept for :meth:`AtDecision.run_here`."""

    __slots__ = ("_here",)

    def __init__(self, here: threading.local) -> None:
        self._here = here

    def submit(self, job: Any) -> None:
        self._here.jobs.append(job)
