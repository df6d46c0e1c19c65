"""The interceptor chain: ordered handlers every SOAP message passes, both ways.

This is Axis2's handler chain (seed 004, 3.4.2: Mercury is "an Axis2 module",
two handlers plus workers) and CXF's ``PhaseInterceptorChain``: a message goes
through interceptors grouped in :class:`Phase` s.  A received message runs the
phases in their order (TRANSPORT, ADDRESSING, RELIABLE_MESSAGING, DISPATCH);
a message being sent runs the exact mirror (DISPATCH first, TRANSPORT last),
like a stack of WSGI middlewares: whatever decoded a header on the way in is
the last to see the message on the way out, so it encodes there.  Within a
phase, ``before``/``after`` name peers (in the in order; mirrored on the way
out); the rest keep their registration order.

An interceptor can take a message out of the flow:

* ``message.abort(response)`` consumes it: it is not delivered (the service is
  not called, the request is not sent), and ``response`` is what the other
  side gets instead (a WS-RM CreateSequenceResponse, a bare 202).
* ``message.suspend(response)`` does the same but remembers where: a worker
  later calls :meth:`InterceptorChain.resume` to run "the rest of the
  handlers" (Mercury's RMS and invoker workers do exactly that after the
  message sat in a store).

The same chain serves a spyne server and a zeep client; the adapters
(:mod:`interceptors.spyne_server.adapter`, :mod:`interceptors.zeep_client.adapter`) turn
their frameworks' requests into :class:`Message` objects and honour aborts.
Third parties extend a chain with interceptors or pluggy hooks
(:mod:`interceptors.hookspecs`), installed under the ``wsrm_interceptors``
entry point group.
"""

from __future__ import annotations

import heapq
import importlib.metadata
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import pluggy

from . import hookspecs
from .message import (
    ChainConfigurationError,
    ChainError,
    Direction,
    Exchange,
    HttpHeaders,
    Message,
    MessageConsumed,
    Phase,
    Response,
    Role,
    action_from_http,
    serialize,
)

__all__ = [
    "ENTRY_POINT_GROUP", "Phase", "Direction", "Role", "HttpHeaders", "Response", "Exchange",
    "Message", "InterceptorLike", "Interceptor", "InterceptorChain", "action_from_http", "serialize",
    "ChainError", "ChainConfigurationError", "MessageConsumed",
]

log = logging.getLogger(__name__)

#: The importlib.metadata entry point group third-party interceptors and plugins are found in.
ENTRY_POINT_GROUP = "wsrm_interceptors"


@runtime_checkable
class InterceptorLike(Protocol):
    """What the chain needs of an interceptor; subclass :class:`Interceptor` to get the defaults."""

    name: str
    phase: Phase
    before: Iterable[str]
    after: Iterable[str]

    def handle_in(self, message: Message) -> None: ...

    def handle_out(self, message: Message) -> None: ...

    def handle_fault(self, message: Message, error: BaseException) -> None: ...


class Interceptor:
    """Base class of interceptors: override what you need.

    ``name`` must be unique in a chain (it is what ``before``/``after`` and
    :meth:`InterceptorChain.resume` refer to); it defaults to the class name.
    ``handle_fault`` is called, most recent first, on every interceptor that
    had handled a message when a later one (or it) raised, so it can undo
    (CXF's unwind).  ``understands`` names the SOAP header blocks
    (``"{namespace}local"``) the interceptor processes: a received message with
    a header marked mustUnderstand that no interceptor (nor the service)
    understands is refused with SOAP's MustUnderstand fault
    (:mod:`interceptors.understood`).
    """

    name: str = ""
    phase: Phase = Phase.DISPATCH
    before: Iterable[str] = ()
    after: Iterable[str] = ()
    understands: frozenset[str] = frozenset()
    #: Can ``handle_in`` change a received envelope in place?  False for one that only reads it
    #: (the addressing interceptor): the message's known bytes (:meth:`Message.serialized_as`,
    #: the request as received) then still stand for its tree after it, and whoever stores the
    #: message (the WS-RM interceptor) takes them instead of serializing the tree again.
    changes_received: bool = True
    #: Does ``handle_out`` leave a message without an envelope (a one-way call's empty 202)
    #: alone?  True for one that only works on envelopes (the addressing and WS-RM
    #: interceptors): when every interceptor of the out chain says so and no hook listens, a
    #: server's empty answer is sent without running the chain (:meth:`InterceptorChain.quiet_without_envelope`).
    quiet_without_envelope: bool = False

    def __init__(self, *, name: str | None = None, phase: Phase | None = None,
                 before: Iterable[str] | None = None, after: Iterable[str] | None = None) -> None:
        if name is not None:
            self.name = name
        elif not self.name:
            self.name = type(self).__name__
        if phase is not None:
            self.phase = phase
        if before is not None:
            self.before = before
        if after is not None:
            self.after = after

    def handle_in(self, message: Message) -> None:
        """Called for each received message; the default does nothing."""

    def handle_out(self, message: Message) -> None:
        """Called for each message being sent; the default does nothing."""

    def handle_fault(self, message: Message, error: BaseException) -> None:
        """Called when handling ``message`` failed after this interceptor ran; default: nothing."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.phase.name}>"


def _names(value: Iterable[str] | str | None, owner: str, attribute: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)  # a lone name, not its letters
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ChainConfigurationError(
                f"interceptor {owner!r}: {attribute} must list interceptor names, got {name!r}")
    return names


@dataclass(frozen=True)
class _Entry:
    interceptor: InterceptorLike
    name: str
    phase: Phase
    before: tuple[str, ...]
    after: tuple[str, ...]
    index: int


def _entry(interceptor: object, index: int) -> _Entry:
    name = getattr(interceptor, "name", None)
    if not isinstance(name, str) or not name:
        raise ChainConfigurationError(
            f"{interceptor!r} has no usable name: an interceptor needs a non-empty str .name")
    phase = getattr(interceptor, "phase", None)
    if not isinstance(phase, Phase):
        raise ChainConfigurationError(
            f"interceptor {name!r}: phase must be an interceptors.Phase, not {phase!r}")
    if not any(callable(getattr(interceptor, h, None)) for h in ("handle_in", "handle_out")):
        raise ChainConfigurationError(
            f"interceptor {name!r} has neither handle_in nor handle_out: it would never run")
    return _Entry(cast(InterceptorLike, interceptor), name, phase,  # duck-typed above
                  _names(getattr(interceptor, "before", ()), name, "before"),
                  _names(getattr(interceptor, "after", ()), name, "after"), index)


_Plan = tuple[tuple[Phase, tuple[_Entry, ...]], ...]


def _order(entries: list[_Entry]) -> _Plan:
    """Group by phase, each group sorted to honour before/after, ties by registration order.

    A constraint naming an interceptor that is not in the chain is ignored (it
    orders against an optional peer).  One naming an interceptor in another
    phase must agree with the phase order, or no order can satisfy it.
    """
    by_name = {e.name: e for e in entries}
    edges: dict[str, set[str]] = {e.name: set() for e in entries}  # name -> must come after it
    for entry in entries:
        pairs = [(entry.name, other) for other in entry.before]
        pairs += [(other, entry.name) for other in entry.after]
        for first, second in pairs:
            if first == second:
                raise ChainConfigurationError(
                    f"interceptor {entry.name!r} cannot be before or after itself")
            if first not in by_name or second not in by_name:
                continue
            a, b = by_name[first], by_name[second]
            if a.phase == b.phase:
                edges[first].add(second)
            elif a.phase > b.phase:
                raise ChainConfigurationError(
                    f"interceptor {entry.name!r} wants {first!r} ({a.phase.name}) to run before "
                    f"{second!r} ({b.phase.name}), but phase {b.phase.name} comes first; "
                    "move one of them to another phase")
    plan = []
    for phase in Phase:
        group = [e for e in entries if e.phase is phase]
        incoming = {e.name: 0 for e in group}
        for e in group:
            for later in edges[e.name]:
                incoming[later] += 1
        ready = [(e.index, e.name) for e in group if incoming[e.name] == 0]
        heapq.heapify(ready)
        ordered = []
        while ready:
            _, name = heapq.heappop(ready)
            ordered.append(by_name[name])
            for later in edges[name]:
                incoming[later] -= 1
                if incoming[later] == 0:
                    heapq.heappush(ready, (by_name[later].index, later))
        if len(ordered) != len(group):
            stuck = sorted(n for n, count in incoming.items() if count > 0)
            raise ChainConfigurationError(
                f"before/after constraints in phase {phase.name} form a cycle among {stuck}; "
                "drop one of the constraints")
        plan.append((phase, tuple(ordered)))
    return tuple(plan)


def _mirror(plan: _Plan) -> _Plan:
    return tuple((phase, tuple(reversed(group))) for phase, group in reversed(plan))


class InterceptorChain:
    """An ordered set of interceptors plus a pluggy plugin manager, shared by many messages.

    Safe to use from many threads at once: running a message reads an
    immutable snapshot of the order; adding or removing interceptors builds a
    new snapshot.  ``load_entry_points=True`` loads everything installed under
    the ``wsrm_interceptors`` entry point group (see :meth:`load_entry_points`).
    """

    def __init__(self, interceptors: Iterable[InterceptorLike] = (), *,
                 plugins: Iterable[object] = (), load_entry_points: bool = False,
                 entry_point_group: str = ENTRY_POINT_GROUP) -> None:
        self._lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._counter = 0
        self._in: _Plan = _order([])
        self._out: _Plan = _mirror(self._in)
        #: What is left of a plan after an interceptor (:meth:`_rest_after`), by the plan's
        #: identity and the name: a delivery resumes after the same one every time.
        self._rest: dict[tuple[int, str], tuple[_Plan, _Plan]] = {}
        self._quiet_without_envelope = True
        self._loaded_entry_points: set[tuple[str, str]] = set()
        self.plugins = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.plugins.add_hookspecs(hookspecs)
        self.add(*interceptors)
        # Historic: plugins registered from now on are asked for their interceptors too.
        self.plugins.hook.wsrm_register_interceptors.call_historic(kwargs={"chain": self})
        for plugin in plugins:
            self.register_plugin(plugin)
        if load_entry_points:
            self.load_entry_points(entry_point_group)

    # -- membership -------------------------------------------------------------
    def add(self, *interceptors: InterceptorLike) -> None:
        """Add interceptors; raises ChainConfigurationError (and adds none) if the order breaks."""
        with self._lock:
            entries = list(self._entries)
            names = {e.name for e in entries}
            for interceptor in interceptors:
                entry = _entry(interceptor, self._counter)
                self._counter += 1
                if entry.name in names:
                    raise ChainConfigurationError(
                        f"an interceptor named {entry.name!r} is already in the chain; "
                        "give the new one another name")
                names.add(entry.name)
                entries.append(entry)
            self._install(entries)

    def remove(self, name: str) -> InterceptorLike:
        """Take the interceptor called ``name`` out; KeyError if there is none."""
        with self._lock:
            for entry in self._entries:
                if entry.name == name:
                    self._install([e for e in self._entries if e is not entry])
                    return entry.interceptor
        raise KeyError(f"no interceptor named {name!r} in this chain")

    def _install(self, entries: list[_Entry]) -> None:
        plan = _order(entries)
        self._entries = entries
        self._in, self._out = plan, _mirror(plan)
        self._rest = {}
        self._quiet_without_envelope = all(getattr(e.interceptor, "quiet_without_envelope", False)
                                           for e in entries)

    def quiet_without_envelope(self) -> bool:
        """Would the out chain leave a message without an envelope as it is?  True when every
        interceptor says its ``handle_out`` does nothing to one (``Interceptor.quiet_without_envelope``)
        and no ``wsrm_out_message`` hook is registered: an adapter may then answer an empty
        reply (a one-way call's 202) without making a message of it and running the chain."""
        return self._quiet_without_envelope and not self.plugins.hook.wsrm_out_message.get_hookimpls()

    def get(self, name: str) -> InterceptorLike | None:
        for entry in self._entries:
            if entry.name == name:
                return entry.interceptor
        return None

    def __contains__(self, name: object) -> bool:
        return any(entry.name == name for entry in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[InterceptorLike]:
        """The interceptors in the in order."""
        return iter(self.in_order())

    def in_order(self) -> list[InterceptorLike]:
        return [e.interceptor for _, group in self._in for e in group]

    def out_order(self) -> list[InterceptorLike]:
        return [e.interceptor for _, group in self._out for e in group]

    def names(self, direction: Direction = Direction.IN) -> list[str]:
        plan = self._in if direction is Direction.IN else self._out
        return [e.name for _, group in plan for e in group]

    def has_phase(self, phase: Phase) -> bool:
        """Does any interceptor run in ``phase`` (the spyne adapter asks RELIABLE_MESSAGING)?"""
        return any(e.phase is phase for e in self._entries)

    # -- plugins ----------------------------------------------------------------
    def register_plugin(self, plugin: object, name: str | None = None) -> None:
        """Register a pluggy plugin (module or object with :data:`hookimpl` functions)."""
        try:
            self.plugins.register(plugin, name=name)
        except ValueError as exc:  # pluggy: already registered / name taken
            raise ChainConfigurationError(f"cannot register plugin {name or plugin!r}: {exc}") from exc
        except pluggy.PluginValidationError as exc:
            raise ChainConfigurationError(
                f"plugin {name or plugin!r} does not match the wsrm hook specifications: {exc}") from exc

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> list[str]:
        """Load what installed distributions declare under ``group``; returns the names loaded.

        An entry point may name an interceptor class (instantiated without
        arguments), an interceptor instance, or a pluggy plugin (a module or
        object implementing hooks of :mod:`interceptors.hookspecs`).  Loading
        twice is harmless: entry points already loaded are skipped.
        """
        loaded = []
        for point in importlib.metadata.entry_points(group=group):
            key = (point.name, point.value)
            if key in self._loaded_entry_points:
                continue  # the same distribution seen twice on sys.path
            try:
                target = point.load()
            except Exception as exc:
                raise ChainConfigurationError(
                    f"entry point {point.name} = {point.value} (group {group}) failed to load: "
                    f"{exc}; fix or uninstall the distribution that declares it") from exc
            self._adopt(target, point)
            self._loaded_entry_points.add(key)
            loaded.append(point.name)
            log.info("loaded interceptor entry point %s = %s", point.name, point.value)
        return loaded

    def _adopt(self, target: object, point: importlib.metadata.EntryPoint) -> None:
        where = f"entry point {point.name} = {point.value}"
        if isinstance(target, type) and isinstance(getattr(target, "phase", None), Phase):
            cls = target
            try:
                target = cls()
            except TypeError as exc:
                raise ChainConfigurationError(
                    f"{where}: interceptor class {cls.__name__} must be constructible without "
                    f"arguments to be loaded from an entry point ({exc}); point to an instance "
                    "or a plugin instead") from exc
        if isinstance(getattr(target, "phase", None), Phase):
            self.add(cast(InterceptorLike, target))  # _entry() checks the rest
            return
        self.register_plugin(target, name=f"entrypoint:{point.name}")
        if not self.plugins.get_hookcallers(target):
            self.plugins.unregister(target)
            raise ChainConfigurationError(
                f"{where} is neither an interceptor (no Phase) nor a plugin implementing a "
                "wsrm hook (no @interceptors.hookimpl function)")

    # -- running ----------------------------------------------------------------
    def handle_in(self, message: Message, *, after: str | None = None) -> Message:
        """Run a received message through the in order (optionally resuming after ``after``)."""
        if message.direction is not Direction.IN:
            raise ChainError(f"handle_in got an outgoing message {message!r}")
        return self._run(message, self._in, self.plugins.hook.wsrm_in_message, "handle_in", after)

    def handle_out(self, message: Message, *, after: str | None = None) -> Message:
        """Run an outgoing message through the out order (the mirror of the in order)."""
        if message.direction is not Direction.OUT:
            raise ChainError(f"handle_out got a received message {message!r}")
        return self._run(message, self._out, self.plugins.hook.wsrm_out_message, "handle_out", after)

    def run(self, message: Message) -> Message:
        """handle_in or handle_out, by the message's direction."""
        if message.direction is Direction.IN:
            return self.handle_in(message)
        return self.handle_out(message)

    def resume(self, message: Message, after: str | None = None) -> Message:
        """Run the rest of the chain after ``after`` (default: where the message was suspended).

        This is what a worker calls once a stored message's time has come;
        the adapters' ``deliver``/``resume_send`` call it and then deliver.
        """
        after = after or message.resume_point
        if after is None:
            raise ChainError(
                f"{message!r} was not suspended; say which interceptor to resume after")
        message._run_again()
        if message.direction is Direction.IN:
            return self.handle_in(message, after=after)
        return self.handle_out(message, after=after)

    def _rest_after(self, plan: _Plan, after: str) -> _Plan:
        """``plan`` from just after the interceptor ``after``: the phases wholly before its one
        left out, and of its phase the interceptors up to it (the phase's hook still runs).

        Worked out once per plan and name (a resumed delivery asked it each time: a look
        through every phase and the chain's names, a dozen Python calls a delivery)."""
        key = (id(plan), after)
        known = self._rest.get(key)
        if known is not None and known[0] is plan:
            return known[1]
        for at, (phase, group) in enumerate(plan):
            for index, entry in enumerate(group):
                if entry.name == after:
                    rest: _Plan = ((phase, group[index + 1:]), *plan[at + 1:])
                    self._rest[key] = (plan, rest)
                    return rest
        raise ChainError(f"cannot resume after {after!r}: no interceptor of that name in the chain")

    def _run(self, message: Message, plan: _Plan, hook: pluggy.HookCaller, handler: str,
             after: str | None) -> Message:
        if after is not None:
            plan = self._rest_after(plan, after)
        done: list[_Entry] = []
        try:
            for phase, group in plan:
                for entry in group:
                    run = getattr(entry.interceptor, handler, None)
                    if run is None:
                        continue
                    message.current = entry.name
                    if handler != "handle_in" or getattr(entry.interceptor, "changes_received", True):
                        message._raw = None  # the interceptor may change the envelope
                    done.append(entry)
                    run(message)
                    message.current = None
                    if message.stopped:
                        message.stopped_by = entry.name
                        log.debug("%s stopped by %s", message, entry.name)
                        return message
                if hook.get_hookimpls():
                    message._raw = None
                    hook(message=message, phase=phase)
                    if message.stopped:
                        message.stopped_by = f"wsrm_{'in' if handler == 'handle_in' else 'out'}_message hook"
                        log.debug("%s stopped by a %s hook", message, phase.name)
                        return message
        except Exception as exc:
            message.current = None
            message.error = exc
            self._unwind(message, done, exc)
            raise
        return message

    def _unwind(self, message: Message, done: list[_Entry], error: Exception) -> None:
        for entry in reversed(done):
            on_fault: Callable[[Message, BaseException], None] | None = getattr(
                entry.interceptor, "handle_fault", None)
            if on_fault is None:
                continue
            try:
                on_fault(message, error)
            except Exception:
                log.exception("interceptor %s failed in handle_fault (ignored; the original "
                              "error is reported)", entry.name)
        try:
            self.plugins.hook.wsrm_fault(message=message, error=error)
        except Exception:
            log.exception("a wsrm_fault hook failed (ignored; the original error is reported)")
