"""The header blocks this package processes: what a node "understands" in SOAP's processing model.

SOAP 1.1 (section 4.2.3) and 1.2 (part 1, section 2.4) oblige the ultimate
receiver to fault a message that carries a header block marked
``mustUnderstand`` it does not process, *before* it does anything else with
the message.  For a reliable endpoint that means before the message is
recorded and acknowledged: a peer that marks a header mustUnderstand is told
that the receiver either honours it or refuses the whole message.

What the engine itself processes is listed here, per protocol.  Not listed,
on purpose: ``wsrm:UsesSequenceSTR`` and ``wsrm:UsesSequenceSSL`` (WS-RM 1.1
section 3.4), which bind a sequence to a security token or a TLS session.
They arrive marked mustUnderstand on a CreateSequence; this package does not
implement the binding, so such a CreateSequence is refused with a
MustUnderstand fault instead of creating a sequence its sender believes is
bound.
"""

from __future__ import annotations

from .addressing import HEADER_NAMES as _WSA_NAMES
from .namespaces import ADDRESSING_VERSIONS, RM_VERSIONS, WSMC_NS
from .rm import RM_HEADER_NAMES

__all__ = ["WSA_HEADERS", "WSRM_HEADERS", "WSMC_HEADERS", "PROTOCOL_HEADERS", "clark"]


def clark(namespace: str, local: str) -> str:
    """``{namespace}local``: how lxml names an element's tag (and how these sets name headers)."""
    return f"{{{namespace}}}{local}"


#: Every WS-Addressing message addressing property, in both versions.
WSA_HEADERS = frozenset(clark(wsa.ns, name) for wsa in ADDRESSING_VERSIONS for name in _WSA_NAMES)
#: The WS-RM header blocks, in both versions (1.0's LastMessage travels inside Sequence).
WSRM_HEADERS = frozenset(clark(rm.ns, name) for rm in RM_VERSIONS for name in RM_HEADER_NAMES)
#: WS-MakeConnection's one header block.
WSMC_HEADERS = frozenset({clark(WSMC_NS, "MessagePending")})
#: What a reliable engine processes of any message it takes.
PROTOCOL_HEADERS = WSA_HEADERS | WSRM_HEADERS | WSMC_HEADERS
