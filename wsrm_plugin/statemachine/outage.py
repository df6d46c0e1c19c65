"""Whether the service can work at all: delivery runs, is suspect, is paused, or is probing.

A message that fails while others are delivered is a poison message: its
attempts and retry cycles (:mod:`.delivery`) are for that.  When deliveries
fail one after the other the way an outage fails (a connection refused, the
database unavailable), the messages are not at fault: the service cannot
work.  Spending their attempts would poison every busy sequence's first
message during a database restart.  So delivery pauses instead: no message is
tried but one, a probe, after a capped and jittered back-off of seconds, and
none of those failures is counted.  The first success resumes delivery at
full speed, in every invoker thread at once.  The anchors: NServiceBus's
automatic rate limiting (after consecutive failures, one message at a time
until one succeeds), MassTransit's kill switch, Spring Kafka's back-off with
container pause, resilience4j's circuit breaker (closed, open, half-open).

===========  ========================================================================
 RUNNING     delivering at full speed
 SUSPECT     a delivery failed as an outage fails; what follows decides: another
             delivery succeeds (the failed message is to blame: its failure counts)
             or enough fail the same way in a row (an outage: none is counted)
 PAUSED      the service cannot work: nothing is delivered until the back-off ends
 PROBING     one message is being delivered to see whether the service works again
===========  ========================================================================

What counts as "failing the way an outage fails" is the engine's
classification (``wsrm_plugin.engine.outage``, steered by the policy), and so
is how many such failures in a row make an outage
(``RMPolicy.pause_after_outage_failures``, 2 by default; NServiceBus's
``OnConsecutiveFailures``): this machine only hears the verdict, OUTAGE while
fewer have failed in a row, OUTAGES_IN_A_ROW at the threshold.  It is kept
in memory by each process (each sees its own connections fail) and written to
the store for ``wsrm status``.
"""

from __future__ import annotations

from enum import Enum

from .common import InvalidTransition, Reason, Transition

__all__ = ["ServiceAction", "ServiceEvent", "ServiceMode", "service_transition"]


class ServiceMode(Enum):
    RUNNING = "delivering at full speed"
    SUSPECT = "a delivery failed as an outage fails: the next outcome decides whose fault it was"
    PAUSED = "the service cannot work: nothing is delivered until the back-off ends"
    PROBING = "one message is delivered to see whether the service works again"

    @classmethod
    def initial(cls) -> ServiceMode:
        return cls.RUNNING

    @classmethod
    def valid_states(cls) -> tuple[ServiceMode, ...]:
        return tuple(cls)

    @classmethod
    def of(cls, label: str) -> ServiceMode:
        return cls[label]

    @property
    def label(self) -> str:
        return self.name

    @property
    def paused(self) -> bool:
        """Delivery is paused (a probe may be out): what ``wsrm status`` and health checks show."""
        return self in (ServiceMode.PAUSED, ServiceMode.PROBING)

    def __str__(self) -> str:
        return f"Service[{self.name}]"


class ServiceEvent(Enum):
    DELIVERED = "a delivery committed"
    FAILED = "a delivery failed, not the way an outage fails (the message's own failure)"
    OUTAGE = ("a delivery failed the way an outage fails (connection refused, database unavailable...), "
              "fewer in a row than the pause's threshold")
    OUTAGES_IN_A_ROW = ("a delivery failed the way an outage fails, the threshold's number in a row "
                        "(RMPolicy.pause_after_outage_failures)")
    PROBE_DUE = "the pause's back-off ended: one message may be tried"
    PROBE_EMPTY = "the probe found no message due: those the pause put off are not due yet"
    NOTHING_WAITING = "the probe found no message due and none put off by the pause: nothing waits for the service"


class ServiceAction(Enum):
    SUSPECT_MESSAGE = "do not count the failure yet: the next outcome says whose it was"
    CHARGE_SUSPECTS = "count the suspect messages' failures: others are delivered, so theirs are their own"
    PAUSE = "stop delivering (one WARNING); the suspects' failures are not counted; a probe after a back-off"
    PROBE = "deliver one message, alone"
    BACK_OFF = "the probe failed (not counted): the next one after a longer back-off"
    RESUME = "deliver at full speed in every invoker thread at once (one INFO)"


_M = ServiceMode
_E = ServiceEvent
_A = ServiceAction

#: (mode, event) -> (mode after, actions).  A pair not here is refused (:data:`_REFUSALS`);
#: a pair mapped to its own mode and no action changes nothing.
RULES: dict[tuple[ServiceMode, ServiceEvent], tuple[ServiceMode, tuple[ServiceAction, ...]]] = {
    (_M.RUNNING, _E.DELIVERED): (_M.RUNNING, ()),
    (_M.RUNNING, _E.FAILED): (_M.RUNNING, ()),
    (_M.RUNNING, _E.OUTAGE): (_M.SUSPECT, (_A.SUSPECT_MESSAGE,)),
    (_M.RUNNING, _E.OUTAGES_IN_A_ROW): (_M.PAUSED, (_A.PAUSE,)),  # a threshold of one

    (_M.SUSPECT, _E.DELIVERED): (_M.RUNNING, (_A.CHARGE_SUSPECTS,)),
    (_M.SUSPECT, _E.FAILED): (_M.SUSPECT, ()),  # says nothing about the service
    (_M.SUSPECT, _E.OUTAGE): (_M.SUSPECT, (_A.SUSPECT_MESSAGE,)),  # below the threshold still
    (_M.SUSPECT, _E.OUTAGES_IN_A_ROW): (_M.PAUSED, (_A.PAUSE,)),

    (_M.PAUSED, _E.DELIVERED): (_M.RUNNING, (_A.RESUME,)),  # one begun before the pause
    (_M.PAUSED, _E.FAILED): (_M.PAUSED, ()),
    (_M.PAUSED, _E.OUTAGE): (_M.PAUSED, ()),  # one begun before the pause: not counted either
    (_M.PAUSED, _E.OUTAGES_IN_A_ROW): (_M.PAUSED, ()),
    (_M.PAUSED, _E.PROBE_DUE): (_M.PROBING, (_A.PROBE,)),

    (_M.PROBING, _E.DELIVERED): (_M.RUNNING, (_A.RESUME,)),
    # the application ran and failed on the message's own account: the service works again
    (_M.PROBING, _E.FAILED): (_M.RUNNING, (_A.RESUME,)),
    (_M.PROBING, _E.OUTAGE): (_M.PAUSED, (_A.BACK_OFF,)),
    (_M.PROBING, _E.OUTAGES_IN_A_ROW): (_M.PAUSED, (_A.BACK_OFF,)),
    (_M.PROBING, _E.PROBE_DUE): (_M.PROBING, ()),  # one probe at a time
    (_M.PROBING, _E.PROBE_EMPTY): (_M.PAUSED, ()),
    # nothing to learn from, and nothing kept from anyone: the next delivery tells (the store
    # was what failed, and is back; or the messages went elsewhere)
    (_M.PROBING, _E.NOTHING_WAITING): (_M.RUNNING, (_A.RESUME,)),
}

_REFUSALS: dict[tuple[ServiceMode, ServiceEvent], Reason] = {
    **{(mode, event): Reason.NOT_PAUSED for mode in (_M.RUNNING, _M.SUSPECT)
       for event in (_E.PROBE_DUE, _E.PROBE_EMPTY, _E.NOTHING_WAITING)},
    (_M.PAUSED, _E.PROBE_EMPTY): Reason.UNEXPECTED,
    (_M.PAUSED, _E.NOTHING_WAITING): Reason.UNEXPECTED,
}


def _decide(mode: ServiceMode, event: ServiceEvent) -> Transition[ServiceMode] | Reason:
    rule = RULES.get((mode, event))
    if rule is None:
        return _REFUSALS[(mode, event)]
    return Transition(mode, *rule)


_TABLE = {(mode, event): _decide(mode, event) for mode in ServiceMode for event in ServiceEvent}


def service_transition(mode: ServiceMode, event: ServiceEvent) -> Transition[ServiceMode]:
    """Apply ``event`` to ``mode``; raises :class:`InvalidTransition` when not allowed."""
    try:
        answer = _TABLE[(mode, event)]
    except (KeyError, TypeError):
        if not isinstance(event, ServiceEvent):
            raise TypeError(f"not a ServiceEvent: {event!r}") from None
        raise TypeError(f"not a ServiceMode: {mode!r}") from None
    if isinstance(answer, Reason):
        raise InvalidTransition(mode, event, answer)
    return answer
