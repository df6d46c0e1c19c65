"""A CreateSequence sent again with the same Offer but a new wsa:MessageID gets the same sequence.

A client that dies before it stores the CreateSequenceResponse sends its
CreateSequence again after its restart.  Its offered identifier is in its
store, its MessageID is new.  Found by ``wsrm demo --crash --in-out --seed
1378978650``: the destination opened a second sequence, declined the offer
("the identifier is already in use"), and every reply to the 60 calls was
undeliverable.  The offered identifier names the pair of sequences, so the
same peer with the same AcksTo gets the first answer again, whether or not
the destination restarted in between.
"""

from __future__ import annotations

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.wire import (
    CreateSequence, CreateSequenceResponse, EndpointReference, Offer, build_envelope, parse_rm_element, to_bytes,
)

from .conftest import fast_policy
from .support import RM11, SOAP12, _addressing, post

OFFERED = "urn:uuid:5e2b4b0c-0000-4000-8000-00000000beef"


def _create(url: str, *, offer: str = OFFERED, acks_to: str | None = None,
            endpoint: str = "http://127.0.0.1:9/replies") -> CreateSequenceResponse:
    wsa = RM11.addressing
    body = CreateSequence(EndpointReference(acks_to or wsa.anonymous),
                          offer=Offer(offer, endpoint=EndpointReference(endpoint))).to_xml(RM11, wsa)
    headers = _addressing(RM11, url, RM11.create_sequence_action).to_elements(wsa, soap=SOAP12)  # a new MessageID
    response = post(url, to_bytes(build_envelope(SOAP12, headers, body)))
    assert response.status == 200, response.body
    parsed, _ = parse_rm_element(response.envelope().body_element)
    assert isinstance(parsed, CreateSequenceResponse)
    return parsed


def _sequences(engine: ReliableEngine) -> tuple[list[str], list[tuple[str, str | None, str]]]:
    with engine.store.begin() as tx:
        return ([s.sequence_id for s in tx.rmd.list_all()],
                [(s.key, s.sequence_id, s.target) for s in tx.rms.list_all()])


def test_the_same_offer_with_a_new_message_id_gets_the_same_sequence_and_accept(engines) -> None:
    server = engines("memory:", serve=True)
    first = _create(server.endpoint_address)
    again = _create(server.endpoint_address)
    assert first.accept is not None and again.accept is not None
    assert again.identifier == first.identifier and again.accept.address == first.accept.address
    rmd, rms = _sequences(server)
    assert rmd == [first.identifier]
    assert [(sid, target) for _, sid, target in rms] == [(OFFERED, "http://127.0.0.1:9/replies")]


def test_after_a_restart_of_the_destination_too(tmp_path) -> None:
    store = f"sqlite:///{tmp_path}/server.db"
    server = ReliableEngine(store, fast_policy())
    server.serve()
    try:
        first = _create(server.endpoint_address)
    finally:
        server.stop()
    restarted = ReliableEngine(store, fast_policy())
    restarted.serve()
    try:
        # the restarted client listens on another port now: its replies go there
        again = _create(restarted.endpoint_address, endpoint="http://127.0.0.1:10/replies")
        assert again.identifier == first.identifier and again.accept is not None
        rmd, rms = _sequences(restarted)
        assert rmd == [first.identifier]
        assert [(sid, target) for _, sid, target in rms] == [(OFFERED, "http://127.0.0.1:10/replies")]
    finally:
        restarted.stop()


def test_another_acks_to_is_another_client_the_offer_is_declined(engines) -> None:
    server = engines("memory:", serve=True)
    first = _create(server.endpoint_address)
    other = _create(server.endpoint_address, acks_to="http://127.0.0.1:11/acks")
    assert other.identifier != first.identifier
    assert other.accept is None  # the identifier is taken: declined, as before
    rmd, rms = _sequences(server)
    assert sorted(rmd) == sorted([first.identifier, other.identifier]) and len(rms) == 1


def test_a_terminated_sequence_is_not_given_again(engines) -> None:
    server = engines("memory:", serve=True)
    first = _create(server.endpoint_address)
    with server.store.begin() as tx:  # as TerminateSequence leaves it: an incomplete sequence ends closed
        tx.rmd.update(first.identifier, terminated=True, closed=True)
    again = _create(server.endpoint_address)
    assert again.identifier != first.identifier and again.accept is None
