"""For any interleaving of requests, replies, losses, AckRequested, Close and Terminate on a
sequence with an Offer: every acknowledgement the destination sends names every number any
earlier one named, and a Final one names every number it accepted (issue 32).

The peer writes its messages by hand (:class:`~tests.conformance.peer.RawPeer`): requests that
answer (Echo) and one-way ones (Note), in any order, repeated (a lost response), skipped (a
lost request), interleaved with AckRequested, acknowledgements of the replies received so far,
CloseSequence and TerminateSequence.  Every answer's acknowledgement of the request sequence
is kept, in the order the answers came.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wsrm_plugin.wire import SequenceAcknowledgement, SequenceHeader, parse_envelope, parse_rm_element

from .peer import RawPeer, acks_of, echo, note

_OPS = st.one_of(
    st.tuples(st.just("send"), st.integers(1, 8), st.sampled_from(["echo", "note"])),
    st.just(("ackreq",)),
    st.just(("ackreplies",)),
    st.just(("close",)),
    st.just(("terminate",)),
)


def _numbers(ack: SequenceAcknowledgement) -> set[int]:
    return {n for lower, upper in ack.ranges for n in range(lower, upper + 1)}


def _reply_numbers(response, offered: str) -> set[int]:
    if not response.body:
        return set()
    found = set()
    for header in parse_envelope(response.body).headers:
        parsed = parse_rm_element(header)
        if parsed is not None and isinstance(parsed[0], SequenceHeader) and parsed[0].identifier == offered:
            found.add(parsed[0].message_number)
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_OPS, min_size=1, max_size=14))
def test_acknowledgements_never_shrink_and_final_names_every_accepted_number(server, ops):
    peer = RawPeer(server.url)
    identifier, offered = peer.open(offer=True)
    assert offered is not None
    acks: list[SequenceAcknowledgement] = []
    accepted: set[int] = set()
    replies: set[int] = set()
    closed = False

    def answered(response, number: int | None = None) -> None:
        acks.extend(a for a in acks_of(response) if a.identifier == identifier)
        replies.update(_reply_numbers(response, offered))
        if number is not None and not closed and 200 <= response.status < 300:
            accepted.add(number)

    for op in [*ops, ("close",), ("terminate",)]:
        if op[0] == "send":
            _, number, kind = op
            answered(peer.message(identifier, number, echo(f"e{number}") if kind == "echo" else note(f"n{number}")),
                     number)
        elif op[0] == "ackreq":
            answered(peer.ack_request(identifier))
        elif op[0] == "ackreplies" and replies:
            peer.acknowledge(SequenceAcknowledgement(offered, SequenceAcknowledgement.ranges_from_numbers(
                sorted(replies))))
        elif op[0] == "close":
            answered(peer.close(identifier))
            closed = True
        elif op[0] == "terminate":
            answered(peer.terminate(identifier))
            closed = True

    named: set[int] = set()
    for ack in acks:
        now = _numbers(ack)
        assert named <= now, f"shrank from {sorted(named)} to {ack.ranges} after {ops}"
        named = now
        if ack.final:
            assert accepted <= now, f"Final {ack.ranges} leaves out {sorted(accepted - now)} after {ops}"
    assert any(a.final for a in acks), f"no Final acknowledgement after {ops}: {acks}"
