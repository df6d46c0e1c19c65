"""What the three state machines share: factor states, transitions and refusals.

Seed 004 (WSO2 Mercury) describes each sequence by a handful of boolean
*factors*; most of the 2^k combinations cannot happen, and the handful that can
are the states.  Keeping the factors as the stored representation (rather than
a hand-numbered state enum) is what lets a store persist them as plain columns
and lets a reader check each state against the protocol rule that allows it.
"""

from __future__ import annotations

import dataclasses
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Iterator, Self, TypeVar, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "MAX_MESSAGE_NUMBER",
    "FactorState",
    "InvalidState",
    "InvalidTransition",
    "Reason",
    "Transition",
    "TransitionRules",
]

#: WS-RM message numbers run from 1 to the largest xs:long (both versions' schemas).
MAX_MESSAGE_NUMBER = 9_223_372_036_854_775_807


class Reason(Enum):
    """Why an event is refused, and the WS-RM fault (subcode) a peer should get, if any.

    ``fault`` is the local name of the WS-RM fault subcode when the event came from
    the network and the spec names a fault for it; ``None`` means the refusal is
    local (the caller or the application did something the state does not allow)
    and the binding layer decides what, if anything, to answer.
    """

    UNKNOWN_SEQUENCE = (
        "UnknownSequence",
        "the sequence has no identifier yet (no CreateSequenceResponse), so nothing can refer to it",
    )
    LAST_MESSAGE_NUMBER_EXCEEDED = (
        "LastMessageNumberExceeded",
        "a message beyond the last message of the sequence",
    )
    LAST_MESSAGE_UNKNOWN = (
        None,
        "the event says the sequence is complete, but its last message is not known yet;"
        " classify messages with rmd_receive() instead of choosing SC/SNC by hand",
    )
    SEQUENCE_CLOSED = (
        "SequenceClosed",
        "the sequence is closed and accepts no new messages; start a new sequence",
    )
    SEQUENCE_TERMINATED = (
        "SequenceTerminated",
        "the sequence is terminated; start a new sequence",
    )
    SEQUENCE_FAULTED = (
        None,
        "the sequence has faulted (retries exhausted or refused by the peer); start a new sequence",
    )
    DELIVERY_ENDED = (
        None,
        "the destination sequence ended (closed, terminated or expired) and hands over no more messages",
    )
    INVALID_ACKNOWLEDGEMENT = (
        "InvalidAcknowledgement",
        "the acknowledgement covers message numbers that were never sent",
    )
    MESSAGE_NUMBER_ROLLOVER = (
        "MessageNumberRollover",
        f"message numbers end at {MAX_MESSAGE_NUMBER}; start a new sequence",
    )
    DELIVERED_ALONE = (
        None,
        "the message failed before, or broke a batch: it is delivered on its own, by an invoker"
        " thread's claim, never taken along after the message before it",
    )
    DELIVERED_APART = (
        None,
        "the message's receive buffered it to deliver it apart itself: no one else takes it meanwhile",
    )
    RUNNING_FIRST = (
        None,
        "the message's application runs before its receipt: it is not in the buffer, and its receipt takes it",
    )
    BEING_SETTLED = (
        None,
        "the message's failed delivery is being judged and counted: no delivery of it may start meanwhile",
    )
    SETTLED = (
        None,
        "the message is out of the invoker's hands (delivered, answered, poisoned, held or discarded)",
    )
    NOT_PAUSED = (
        None,
        "delivery is not paused: there is nothing to probe",
    )
    LANE_BUSY = (
        None,
        "the sequence's lane is not idle: the request goes with the sender's round, which its commit woke",
    )
    UNEXPECTED = (
        None,
        "the state never asked for this (a worker acted out of turn or a peer answered a request"
        " that was not sent); re-read the state and act on its duties",
    )

    def __init__(self, fault: str | None, explanation: str) -> None:
        self.fault = fault
        self.explanation = explanation


class InvalidState(ValueError):
    """A combination of factors the protocol cannot produce (e.g. a corrupt stored row)."""

    def __init__(self, state_class: type, factors: dict[str, bool], broken: tuple[str, ...]) -> None:
        self.state_class = state_class
        self.factors = factors
        self.broken = broken
        shown = ", ".join(f"{name}={value}" for name, value in factors.items())
        super().__init__(f"{state_class.__name__}({shown}) is not a valid state: " + "; ".join(broken))


class InvalidTransition(Exception):
    """``event`` is not allowed in ``state``; ``reason`` says why and maps to a WS-RM fault.

    The state is unchanged: the caller rolls back the event's transaction (or
    simply does not write anything) and, for a network event, answers with
    ``fault`` when it is not None.
    """

    def __init__(self, state: Any, event: Enum, reason: Reason, detail: str = "") -> None:
        self.state = state
        self.event = event
        self.reason = reason
        self.detail = detail
        text = f"{event.name} refused in {state}: {reason.explanation}"
        super().__init__(f"{text} ({detail})" if detail else text)

    @property
    def fault(self) -> str | None:
        """The WS-RM fault subcode to send back, or None when there is none to send."""
        return self.reason.fault


S = TypeVar("S")


@dataclass(frozen=True)
class Transition(Generic[S]):
    """The outcome of one event: the new state and the one-shot actions to do with it.

    ``actions`` are done inside the same store transaction as the state write
    (buffer the message, record the identifier, reply to a Close...), in order.
    Standing obligations (retransmit, ack, deliver) are not actions: they are
    *duties* derived from the state, which is what keeps a lost message harmless
    (seed 004: the state stays, so the duty stays, so the worker tries again).
    """

    previous: S
    state: S
    actions: tuple[Enum, ...] = ()

    @property
    def noop(self) -> bool:
        """True when the event changes nothing: same state, nothing to do (duplicates, late acks)."""
        return self.state == self.previous and not self.actions


E = TypeVar("E", bound=Enum)


class TransitionRules(Generic[S, E]):
    """A machine's transition function from its table of rules (one per event, each a pure
    function of the state and the event): each (state, event) is worked out once, and its
    :class:`Transition` -- frozen, like the states -- handed out again after.  A rule that
    refuses the event raises every time.

    Every message takes a transition or two of the RMS, RMD and lane machines on each side:
    the rule's checks, the new state's look-up and a new Transition cost about fifteen Python
    calls each time, a dictionary look-up three."""

    __slots__ = ("_rules", "_kind", "_done")

    def __init__(self, rules: Mapping[E, Callable[[S, E], Transition[S]]], kind: str) -> None:
        self._rules = rules
        self._kind = kind
        self._done: dict[tuple[S, E], Transition[S]] = {}

    def __call__(self, state: S, event: E) -> Transition[S]:
        done = self._done.get((state, event))
        if done is None:
            rule = self._rules.get(event)
            if rule is None:
                raise TypeError(f"not {self._kind}: {event!r}")
            done = self._done[(state, event)] = rule(state, event)
        return done


#: Results of FactorState.replace, by (state, *changes): a few dozen in all.
_REPLACED: dict[tuple[Any, ...], Any] = {}
_MAX_REPLACED = 4096


class FactorState(ABC):
    """Base for the frozen dataclasses whose boolean fields are a machine's factors.

    Subclasses declare ``ABBREVIATIONS`` (field -> the seed's abbreviation) and
    ``_broken_rules``; construction refuses a combination the protocol cannot
    produce, so an invalid state never exists in running code.
    """

    ABBREVIATIONS: ClassVar[dict[str, str]]
    PREFIX: ClassVar[str]

    def __post_init__(self) -> None:
        factors = self.factors()
        for name, value in factors.items():
            if not isinstance(value, bool):
                raise TypeError(f"{type(self).__name__}.{name} must be a bool, got {value!r}")
        broken = self._broken_rules(**factors)
        if broken:
            raise InvalidState(type(self), factors, broken)

    @classmethod
    @abstractmethod
    def _broken_rules(cls, *args: Any, **factors: Any) -> tuple[str, ...]:
        """The rules these factors break; each machine states its own (its factors as keywords)."""

    @classmethod
    def _factor_names(cls) -> list[str]:
        # every machine is a dataclass of bool factors; this base class is not one itself
        return [f.name for f in dataclasses.fields(cast("type[DataclassInstance]", cls))]

    @classmethod
    def broken_rules(cls, **factors: bool) -> tuple[str, ...]:
        """The protocol rules a combination of factors breaks (empty: it is a valid state)."""
        names = cls._factor_names()
        unknown = set(factors) - set(names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no factor(s) {sorted(unknown)}; factors are {names}")
        full = {name: factors.get(name, False) for name in names}
        return cls._broken_rules(**full)

    @classmethod
    def is_valid(cls, **factors: bool) -> bool:
        """Whether the combination is a state the protocol can reach (missing factors are False)."""
        return not cls.broken_rules(**factors)

    @classmethod
    def combinations(cls) -> Iterator[dict[str, bool]]:
        """All 2^k assignments of the factors, valid or not (for checking the model)."""
        names = cls._factor_names()
        for values in itertools.product((False, True), repeat=len(names)):
            yield dict(zip(names, values, strict=True))

    @classmethod
    def valid_states(cls) -> tuple[Self, ...]:
        """Every valid state, in factor order."""
        return tuple(cls(**c) for c in cls.combinations() if cls.is_valid(**c))

    @classmethod
    def of(cls, label: str) -> Self:
        """Build a state from the seed's notation: ``RMSState.of("SS MIB")``; "-" is all false."""
        by_abbreviation = {abbr: name for name, abbr in cls.ABBREVIATIONS.items()}
        tokens = label.replace("+", " ").split()
        if tokens == ["-"]:
            tokens = []
        unknown = [t for t in tokens if t not in by_abbreviation]
        if unknown:
            raise ValueError(
                f"{cls.__name__}: unknown factor(s) {unknown}; use {sorted(by_abbreviation)}"
            )
        return cls(**{by_abbreviation[t]: True for t in tokens})

    def factors(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        """The true factors in the seed's notation, e.g. ``"SS MIB LMR"`` ("-" when none)."""
        true = [self.ABBREVIATIONS[name] for name, value in self.factors().items() if value]
        return " ".join(true) or "-"

    def replace(self, **changes: Any) -> Self:
        # A machine has a handful of states and transitions, and every message takes one: the
        # result is kept, so each is built and checked once (a state is frozen and hashable).
        # Only real bools share an entry: 1 == True, and a non-bool must still be refused.
        if all(type(value) is bool for value in changes.values()):
            key = (self, *changes.items())
            new = _REPLACED.get(key)
            if new is None:
                new = dataclasses.replace(self, **changes)  # type: ignore[type-var]
                if len(_REPLACED) < _MAX_REPLACED:
                    _REPLACED[key] = new
            return new
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def __str__(self) -> str:
        return f"{self.PREFIX}[{self.label}]"
