"""Refusals of the state machines and the store, as the WS-RM faults a peer understands.

The state machines name a fault by its spec name (``Reason.fault``); the
store raises its own errors.  Both become :mod:`wsrm_plugin.wire.faults`
exceptions here, in the sequence's WS-RM version.  A fault the version does
not define is replaced by its nearest relative (1.0 has no SequenceClosed: a
closed 1.0 sequence is as good as terminated to its peer).
"""

from __future__ import annotations

from collections.abc import Callable

from ..statemachine import InvalidTransition
from ..wire import RMVersion, SoapFault, WSRMFault
from ..wire.faults import RM_FAULT_CLASSES

__all__ = ["rm_fault", "fault_for_transition", "busy_fault", "BusyFault", "UnsupportedMediaType"]

_NEAREST = {
    "SequenceClosed": "SequenceTerminated",        # 1.0
    "LastMessageNumberExceeded": "SequenceClosed",  # 1.1
    "WSRMRequired": None,                           # 1.0: a plain Sender fault
}


def rm_fault(fault_code: str, version: RMVersion, identifier: str | None, reason: str | None = None) -> SoapFault:
    """The ``fault_code`` fault in ``version`` (or its nearest relative there)."""
    code: str | None = fault_code
    while code is not None and code not in version.fault_codes:
        code = _NEAREST.get(code)
    if code is None:
        return SoapFault(reason or f"{fault_code} (WS-RM {version.name} has no such fault)", code="Sender")
    # a registered subclass takes (identifier, reason, ...), not the base class's fault_code first
    cls: Callable[..., WSRMFault] | None = RM_FAULT_CLASSES.get(code)
    if cls is None:
        return WSRMFault(code, reason, identifier, version=version)
    return cls(identifier, reason, version=version)


def fault_for_transition(exc: InvalidTransition, version: RMVersion, identifier: str) -> SoapFault:
    """The fault answering a refused network event (a Receiver fault when the spec names none)."""
    if exc.fault is None:
        return SoapFault(f"refused: {exc}", code="Receiver")
    return rm_fault(exc.fault, version, identifier, str(exc))


class BusyFault(SoapFault):
    """The destination cannot take the message now (full, or its store is failing): retransmit later.

    Answered with HTTP 503 and ``Retry-After`` (RFC 9110 15.6.4), and a
    Receiver SOAP fault that is NOT a WS-RM fault: WS-RM defines no "try
    later", and its faults (SequenceTerminated...) would end the sequence.
    Nothing about the message is recorded, so it is not acknowledged and the
    source sends it again -- as WCF's destination does with a message beyond
    its transfer window (dropped unacknowledged), but saying so.
    """

    code = "Receiver"

    def __init__(self, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason, code="Receiver")
        self.retry_after = retry_after


class UnsupportedMediaType(SoapFault):
    """The Content-Type names another SOAP version than the envelope's (HTTP 415, VersionMismatch)."""

    code = "VersionMismatch"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, code="VersionMismatch")


def busy_fault(reason: str, retry_after: int | None = None) -> BusyFault:
    """The destination cannot take the message now; the source should retransmit later."""
    return BusyFault(reason, retry_after)
