"""Phase 2 after the caller: a commit that returns once its decision is durable.

Once every branch voted yes and the decision is durable (a commit mark committed with its
branch, see :mod:`txmanager.marks`), the outcome is fixed: recovery commits whatever a crash
leaves prepared.  The ``COMMIT PREPARED`` of the other branches then only makes their rows
visible, and costs the caller a round trip and a WAL flush it need not wait for.  A
transaction asked to (:meth:`Transaction.commit_at_decision`) returns from ``commit`` at the
decision and hands that second phase to :class:`PhaseTwoWorkers`, as Narayana does with
``CoordinatorEnvironmentBean.asyncCommit`` and X/Open TX with ``TX_COMMIT_DECISION_LOGGED``.
What those say holds here too: a heuristic outcome of phase 2 is logged (and kept in the
recovery log), not raised to a caller that has gone on; a branch that cannot be reached is
left to recovery, as in a commit that waits.

What the caller gives up is visibility, not the outcome: until its :class:`PhaseTwo` is done,
another session of the branch's database sees the rows as they were before (and waits, on a
row lock, to change one of them).  A caller that must see them (the next message of the
same sequence, whose application may read what the last one wrote) waits for it.

Several threads, not one: concurrent ``COMMIT PREPARED`` statements share PostgreSQL's WAL
flushes (group commit), one after the other each would wait for its own.
"""

from __future__ import annotations

import logging
import threading

from .job_threads import JobThreads

__all__ = ["PhaseTwo", "PhaseTwoWorkers"]

log = logging.getLogger(__name__)


class PhaseTwo:
    """A transaction's end as someone waiting for it sees it: done once the transaction is
    over (its phase 2 finished after the caller returned, or it ended any other way).  A
    synchronization of its transaction (see :meth:`Transaction.commit_at_decision`): after
    phase 2, whenever that ran."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done (at most ``timeout`` seconds); True once done."""
        return self._event.wait(timeout)

    def before_completion(self) -> None:
        """(a synchronization with nothing to do before completion)"""

    def after_completion(self, status: object) -> None:
        """As a synchronization of its transaction: its end (of any outcome) is the end."""
        self._event.set()


class PhaseTwoWorkers(JobThreads):
    """The threads that run the second phases handed to them (:meth:`submit`), at most
    ``threads`` at once, started when first needed (daemon threads: a process that exits with
    phases still to run leaves their branches prepared, and recovery commits them by their
    decision).  :meth:`drain` waits until none waits or runs (an engine's stop)."""

    logger = log
    failure = "a second phase run after its caller returned failed"

    def __init__(self, threads: int = 4, name: str = "txmanager-phase-two") -> None:
        super().__init__(threads, name)
