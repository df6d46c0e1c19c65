"""The one place a destination's SequenceAcknowledgement is made, from the sequence's state.

Every acknowledgement this engine sends -- on an HTTP response, piggybacked on
a message going the other way, as a SequenceAcknowledgement message of its
own, with CloseSequenceResponse or TerminateSequenceResponse, in answer to
AckRequested, parked for a MakeConnection poll -- is
:func:`acknowledgement_of` the destination sequence's stored state.  So they
cannot disagree: each names every number the destination has accepted (the
received ranges only ever grow in the store), and one marked ``Final``
(1.1, once the sequence is closed or terminated) names all of them.  WS-RM
1.0 section 3.2 and 1.1 section 3.9 require exactly that of every
acknowledgement; a peer that checks the invariant (WCF, gSOAP) faults a
sequence whose acknowledgements shrink.

What an acknowledgement never does is hold a number back.  A request whose
reply is still owed on the HTTP back-channel is acknowledged like any other:
keeping the request until its reply arrived is its *source's* business (the
reliable client keeps retransmitting it; WCF's initiator does the same, see
its "Retrying Replies"), and a destination that wants the retransmission
simply answers the request's HTTP exchange without an acknowledgement (a 202)
while the reply is not ready.
"""

from __future__ import annotations

from ..statemachine import RMDState
from ..statemachine.ackranges import AckRanges
from ..store import RmdSequence
from ..store.api.states import received_ranges, rmd_state
from ..wire import SequenceAcknowledgement
from ..wire.namespaces import RM_VERSIONS

__all__ = ["acknowledgement_of"]

_RM_BY_NS = {v.ns: v for v in RM_VERSIONS}


def acknowledgement_of(seq: RmdSequence, received: AckRanges | None = None, state: RMDState | None = None,
                       ) -> SequenceAcknowledgement | None:
    """The acknowledgement of destination sequence ``seq`` as it stands; None for a WS-RM 1.0
    sequence before its first message (1.0 has no acknowledgement of nothing).

    ``received`` and ``state`` are the sequence's ranges and state machine state
    just committed, when the caller has them and ``seq`` is the record as read
    before (a receive knows what it recorded): the same function, the same
    acknowledgement, without reading the store again.  Final is the state
    machine's say (closed or terminated: the numbers can no longer change).
    """
    version = _RM_BY_NS[seq.rm_version]
    ranges = received if received is not None else received_ranges(seq)
    if not ranges and not version.is_11:
        return None
    final = (state if state is not None else rmd_state(seq)).final
    return SequenceAcknowledgement(seq.sequence_id, list(ranges.ranges), final=version.is_11 and final)
