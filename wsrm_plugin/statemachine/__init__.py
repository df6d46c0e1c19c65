"""The three WS-RM state machines of seed 004 (WSO2 Mercury), as pure code.

State lives in the store, not in objects: every event is a short transaction
that reads a sequence's state, applies ``transition(state, event)``, does the
returned actions and writes the new state back; workers read states and do
their *duties* (``duties(state)``).  Nothing here does I/O, so the same rules
serve the memory, SQLite and PostgreSQL stores, inside a user's XA transaction
or not.

* :mod:`.rms` - the source sequence (CreateSequence, (re)transmission, close, terminate);
* :mod:`.rmd` - the destination sequence (accepting, acking, close, terminate);
* :mod:`.invoker` - the buffer between the destination and the application;
* :mod:`.lane` - who sends a source sequence's messages now (the sender's round, a waiting caller);
* :mod:`.peer` - whether the source can reach a peer (its circuit breaker: one probe while it is down);
* :mod:`.delivery` - one buffered message's life in the invoker (retries, cycles, poison), and the way
  its receive delivers it, read from its state;
* :mod:`.outage` - whether the service can work at all (running, suspect, paused, probing);
* :mod:`.ackranges` - message numbers as merged ranges (acks, duplicates, completeness).

A refused event raises :class:`InvalidTransition`, whose ``fault`` names the
WS-RM fault to answer with when there is one; an event that changes nothing
(a duplicate, a second ack for all) is a transition with ``noop`` true.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

from .ackranges import AckRanges
from .common import MAX_MESSAGE_NUMBER, FactorState, InvalidState, InvalidTransition, Reason, Transition
from .delivery import (
    WAYS, MessageAction, MessageEvent, MessageState, Stage, Way, message_transition, receipt_way, stored_state,
    way_in,
)
from .invoker import (
    InvokerAction,
    InvokerDuty,
    InvokerEvent,
    InvokerState,
    invoker_duties,
    invoker_transition,
)
from .lane import LaneAction, LaneEvent, LaneState, lane_transition
from .peer import PeerAction, PeerDuty, PeerEvent, PeerState, peer_duties, peer_failure, peer_transition
from .outage import ServiceAction, ServiceEvent, ServiceMode, service_transition
from .rmd import RMDAction, RMDDuty, RMDEvent, RMDState, Reception, rmd_duties, rmd_receive, rmd_transition
from .rms import (
    AckOutcome,
    RMSAction,
    RMSDuty,
    RMSEvent,
    RMSState,
    rms_acknowledge,
    rms_duties,
    rms_transition,
)

__all__ = [
    "MAX_MESSAGE_NUMBER",
    "AckOutcome",
    "AckRanges",
    "FactorState",
    "InvalidState",
    "InvalidTransition",
    "InvokerAction",
    "InvokerDuty",
    "InvokerEvent",
    "InvokerState",
    "LaneAction",
    "LaneEvent",
    "LaneState",
    "PeerAction",
    "PeerDuty",
    "PeerEvent",
    "PeerState",
    "MessageAction",
    "MessageEvent",
    "MessageState",
    "RMDAction",
    "RMDDuty",
    "RMDEvent",
    "RMDState",
    "RMSAction",
    "RMSDuty",
    "RMSEvent",
    "RMSState",
    "Reason",
    "Reception",
    "ServiceAction",
    "ServiceEvent",
    "ServiceMode",
    "Stage",
    "Transition",
    "WAYS",
    "Way",
    "duties",
    "invoker_duties",
    "invoker_transition",
    "lane_transition",
    "peer_duties",
    "peer_failure",
    "peer_transition",
    "message_transition",
    "rmd_duties",
    "receipt_way",
    "rmd_receive",
    "rmd_transition",
    "rms_acknowledge",
    "rms_duties",
    "rms_transition",
    "service_transition",
    "stored_state",
    "transition",
    "way_in",
]


@singledispatch
def transition(state: Any, event: Any) -> Transition[Any]:
    """Apply ``event`` to any of the machines' states (dispatches on the state's type)."""
    raise TypeError(f"no state machine for {type(state).__name__}; "
                    "expected RMSState, RMDState, InvokerState or PeerState")


@transition.register
def _(state: RMSState, event: RMSEvent) -> Transition[RMSState]:
    return rms_transition(state, event)


@transition.register
def _(state: RMDState, event: RMDEvent) -> Transition[RMDState]:
    return rmd_transition(state, event)


@transition.register
def _(state: InvokerState, event: InvokerEvent) -> Transition[InvokerState]:
    return invoker_transition(state, event)


@transition.register
def _(state: PeerState, event: PeerEvent) -> Transition[PeerState]:
    return peer_transition(state, event)


@transition.register
def _(state: LaneState, event: LaneEvent) -> Transition[LaneState]:
    return lane_transition(state, event)


@transition.register
def _(state: MessageState, event: MessageEvent) -> Transition[MessageState]:
    return message_transition(state, event)


@transition.register
def _(state: ServiceMode, event: ServiceEvent) -> Transition[ServiceMode]:
    return service_transition(state, event)


@singledispatch
def duties(state: Any, **options: Any) -> frozenset[Any]:
    """The worker duties of any of the machines' states (``close_first`` applies to RMS only)."""
    raise TypeError(f"no state machine for {type(state).__name__}; "
                    "expected RMSState, RMDState, InvokerState or PeerState")


@duties.register
def _(state: RMSState, *, close_first: bool = False) -> frozenset[RMSDuty]:
    return rms_duties(state, close_first=close_first)


@duties.register
def _(state: RMDState) -> frozenset[RMDDuty]:
    return rmd_duties(state)


@duties.register
def _(state: InvokerState) -> frozenset[InvokerDuty]:
    return invoker_duties(state)


@duties.register
def _(state: PeerState) -> frozenset[PeerDuty]:
    return peer_duties(state)
