"""The state machines drawn from their own transition functions (Graphviz DOT text).

A picture drawn by hand drifts from the code the first time a rule changes.
These are computed: every valid state of a machine is offered every event,
and whatever the transition function answers (a new state, actions, a
refusal) is what the picture shows.  The documentation's concepts page draws
them at build time (``docs/_ext/statemachines.py``), so a page that shows an
edge the code no longer has cannot be built.

Nothing here does I/O; :func:`to_dot` returns text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .common import InvalidTransition, Transition

__all__ = ["Edge", "Machine", "MACHINES", "edges", "machine", "to_dot"]


@dataclass(frozen=True)
class Machine:
    """What a drawing needs to know of one machine: its states, events and rules."""

    name: str
    title: str
    #: Every valid state (the drawing's nodes).
    states: Callable[[], Iterable[Any]]
    events: Callable[[], Iterable[Enum]]
    transition: Callable[[Any, Any], Transition[Any]]
    #: The states a new instance starts in (drawn with an arrow from nowhere).
    initial: Callable[[], Iterable[Any]]
    #: How a state is written on its node.
    label: Callable[[Any], str] = lambda state: getattr(state, "label", str(state))


@dataclass(frozen=True)
class Edge:
    """One arrow: the events that lead from ``source`` to ``target``, and what they do."""

    source: Any
    target: Any
    events: tuple[Enum, ...]
    actions: tuple[Enum, ...]


def edges(m: Machine) -> list[Edge]:
    """Every allowed, effective transition of ``m``, events with the same ends merged.

    A refused event (``InvalidTransition``) and one that changes nothing
    (``Transition.noop``) draw no arrow; an event that keeps the state but
    acts (buffering one more message) draws a loop.
    """
    merged: dict[tuple[Any, Any], tuple[list[Enum], list[Enum]]] = {}
    for state in m.states():
        for event in m.events():
            try:
                result = m.transition(state, event)
            except InvalidTransition:
                continue
            if result.noop:
                continue
            events, actions = merged.setdefault((state, result.state), ([], []))
            events.append(event)
            actions.extend(a for a in result.actions if a not in actions)
    return [Edge(source, target, tuple(events), tuple(actions))
            for (source, target), (events, actions) in merged.items()]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(m: Machine) -> str:
    """The DOT text of ``m``: a node per valid state, an arrow per :class:`Edge`, labelled
    with the events' names (the actions, when there are any, under them in italics)."""
    states = list(m.states())
    ids = {state: f"s{i}" for i, state in enumerate(states)}
    lines = [f"digraph {m.name} {{",
             '  graph [rankdir=LR, fontname="Helvetica", fontsize=11, nodesep=0.35, ranksep=0.5];',
             '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=8];']
    for state in states:
        lines.append(f"  {ids[state]} [label={_quote(m.label(state))}];")
    for i, state in enumerate(m.initial()):
        lines.append(f'  start{i} [shape=point, width=0.12, label=""];')
        lines.append(f"  start{i} -> {ids[state]};")
    for edge in edges(m):
        label = ", ".join(e.name for e in edge.events)
        if edge.actions:
            label += "<BR/><I>" + ", ".join(a.name.lower() for a in edge.actions) + "</I>"
            rendered = "<" + label.replace("&", "&amp;") + ">"
        else:
            rendered = _quote(label)
        lines.append(f"  {ids[edge.source]} -> {ids[edge.target]} [label={rendered}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _builtin() -> dict[str, Machine]:
    from .delivery import MessageEvent, MessageState, message_transition
    from .invoker import InvokerEvent, InvokerState, invoker_transition
    from .lane import LaneEvent, LaneState, lane_transition
    from .peer import PeerEvent, PeerState, peer_transition
    from .outage import ServiceEvent, ServiceMode, service_transition
    from .rmd import RMDEvent, RMDState, rmd_transition
    from .rms import RMSEvent, RMSState, rms_transition

    return {
        "rms": Machine("rms", "RM source sequence", RMSState.valid_states, lambda: RMSEvent,
                       rms_transition, lambda: (RMSState.initial(), RMSState.initial(offered=True))),
        "rmd": Machine("rmd", "RM destination sequence", RMDState.valid_states, lambda: RMDEvent,
                       rmd_transition, lambda: (RMDState.initial(),)),
        "invoker": Machine("invoker", "invoker buffer", InvokerState.valid_states, lambda: InvokerEvent,
                           invoker_transition, lambda: (InvokerState.initial(),)),
        "peer": Machine("peer", "peer reachability (the source's circuit breaker)", PeerState.valid_states,
                        lambda: PeerEvent, peer_transition, lambda: (PeerState.initial(),)),
        "lane": Machine("lane", "who sends a source sequence's messages (the sender's round, a waiting caller)",
                        LaneState.valid_states, lambda: LaneEvent, lane_transition, lambda: (LaneState.initial(),)),
        "delivery": Machine("delivery", "a buffered message in the invoker", MessageState.valid_states,
                            lambda: MessageEvent, message_transition,
                            lambda: (MessageState.initial(), MessageState.initial(taken_on_receipt=True),
                                     MessageState.initial(run_first=True))),
        "outage": Machine("outage", "the service's delivery (outage pause)", ServiceMode.valid_states,
                          lambda: ServiceEvent, service_transition, lambda: (ServiceMode.initial(),)),
    }


#: The machines the documentation draws, by name (filled on first use: importing this
#: module must not import every machine).
MACHINES: dict[str, Machine] = {}


def machine(name: str) -> Machine:
    """The built-in machine called ``name`` (``rms``, ``rmd``, ``invoker``, ...)."""
    if not MACHINES:
        MACHINES.update(_builtin())
    try:
        return MACHINES[name]
    except KeyError:
        raise KeyError(f"no state machine called {name!r}; there are {sorted(MACHINES)}") from None
