"""What the engine tells an observer about each message's way: the hook tracing plugs into.

A reliable message is not one request: it is stored in the caller's
transaction, sent (and sent again) by a worker, received and stored by the
peer, and delivered later in a transaction of its own, maybe after a restart
of either side.  An interceptor chain sees only the first and third of those
(a client's call, a server's request), so the engine calls an
:class:`Observer` at each of the four steps itself:

* :meth:`Observer.sending` -- a message is enqueued (``Source.send``, a
  service's reply): inside the caller's transaction when there is one; the
  step's :meth:`Step.headers` go into the stored envelope;
* :meth:`Observer.transmitting` -- one transmission attempt of a stored
  message, with its number and why it is sent again;
* :meth:`Observer.receiving` -- the destination takes (or recognises as a
  duplicate) a received message; the step may rewrite what is stored;
* :meth:`Observer.delivering` -- the message is handed to the application
  in its delivery transaction; the step ends when that transaction ends.

Each returns a :class:`Step`.  No observer is installed by default
(:data:`active` is None) and the engine then does none of this work;
:func:`install` puts one in place for every engine of the process, as
OpenTelemetry instrumentations do (:mod:`wsrm_plugin.otel` is the one this
package ships).  An observer must not raise: it watches, it never decides.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from lxml import etree

__all__ = ["Observer", "Step", "active", "install", "uninstall"]


class Step:
    """One step of one message, as an observer follows it (a span, for a tracer).

    The engine calls :meth:`note` with what it learns, then :meth:`end`
    once (with the error that ended the step, if one did).  ``data`` is the
    message as the step leaves it: a transmission's bytes to send, a
    receive's bytes to store.
    """

    data: bytes = b""

    def headers(self) -> list[etree._Element]:
        """SOAP header blocks to put in the message being stored (a trace context)."""
        return []

    def note(self, **facts: Any) -> None:
        """Facts learnt along the step (a sequence number, an HTTP status, a duplicate...)."""

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Make this step the current context while the application runs in it."""
        yield

    def end(self, error: BaseException | None = None) -> None:
        """The step is over; ``error`` is what ended it, if anything did."""


class Observer:
    """The four steps of a message's way (see the module docstring); subclass what you need."""

    def sending(self, *, target: str | None, action: str | None, reply: bool,
                transaction: str | None) -> Step:
        """A message to ``target`` is being enqueued (``reply``: a service's answer), in
        ``transaction`` (the caller's XA transaction id, or None)."""
        return Step()

    def transmitting(self, data: bytes, *, target: str, action: str, sequence_id: str, number: int,
                     attempt: int, reason: str | None) -> Step:
        """Attempt ``attempt`` of message ``number``; ``reason`` says why it goes again (None
        for the first attempt).  The step's ``data`` is what is sent."""
        step = Step()
        step.data = data
        return step

    def receiving(self, data: bytes, *, headers: list[etree._Element], sequence_id: str, number: int,
                  action: str | None, message_id: str | None) -> Step:
        """A message of a destination sequence arrived; the step's ``data`` is what is stored."""
        step = Step()
        step.data = data
        return step

    def delivering(self, payload: bytes, *, sequence_id: str, number: int, action: str,
                   message_id: str | None, transaction: str | None) -> Step:
        """The message is handed to the application in its delivery transaction."""
        return Step()


#: The observer every engine of the process reports to; None: nothing is observed.
active: Observer | None = None


def install(observer: Observer) -> None:
    """Report every engine's steps to ``observer`` from now on (replacing the one installed)."""
    global active
    active = observer


def uninstall(observer: Observer | None = None) -> None:
    """Stop observing (only if ``observer`` is the one installed, when given)."""
    global active
    if observer is None or active is observer:
        active = None
