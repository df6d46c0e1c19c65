"""The way a receive delivers its message is read from the message's state in the delivery
machine (``statemachine.delivery.WAYS``), never from flags beside it: the destination's record
takes the message, or buffers it, as that state says.  A real engine on a real store (memory);
each receipt is recorded in a store transaction, as a receive records it."""

from __future__ import annotations

import pytest

from wsrm_plugin.engine.destination import _Receipt
from wsrm_plugin.statemachine import InvalidTransition, MessageState, Stage, Way, way_in
from wsrm_plugin.wire import WSA_2005_08, AddressingHeaders, SequenceHeader

from .support import RM11

SOAP = "http://www.w3.org/2003/05/soap-envelope"


def _receipt(identifier: str, number: int, way: Way | None = None) -> _Receipt:
    item = _Receipt(SequenceHeader(identifier, number), RM11, b"<e/>", AddressingHeaders(action="urn:a"), None,
                    SOAP, False)
    if way is not None:
        item.state = way_in(way)
    return item


def test_a_receipt_reads_its_way_from_its_messages_state():
    item = _receipt("s", 1)
    assert item.state == MessageState.initial() and item.way is Way.BUFFERED
    for way in Way:
        item.state = way_in(way)
        assert item.way is way
    item.state = MessageState(Stage.SETTLING, alone=True)  # received again after a failure on receipt
    assert item.way is Way.BUFFERED


@pytest.mark.parametrize("way, taken", [(Way.BUFFERED, False), (Way.APART, False), (Way.INSIDE, True),
                                        (Way.FIRST, True)])
def test_the_record_takes_the_message_or_buffers_it_as_its_state_says(engines, way, taken):
    engine = engines("memory:")
    destination = engine.destination
    identifier = f"urn:way:{way.name}"
    with engine.store.begin() as tx:
        tx.rmd.create(identifier, acks_to=WSA_2005_08.anonymous, rm_version=RM11.ns, wsa_version=WSA_2005_08.ns)
    item = _receipt(identifier, 1, way)
    with engine.store.begin() as tx:
        _, reception = destination._record(tx, item)
    assert not reception.duplicate
    assert item.taken is taken
    with engine.store.begin() as tx:
        assert list(tx.rmd.get(identifier).received.ranges) == [(1, 1)]
        assert tx.invoker.count() == (0 if taken else 1)  # taken: recorded as delivered, never buffered


def test_a_receive_that_buffered_its_message_cannot_be_received_again_as_failed_on_receipt(engines):
    """FAILED is refused from WAITING: a receive that only buffered never delivered, so nothing
    of it failed on receipt; the destination raises before it holds or records anything."""
    engine = engines("memory:")
    item = _receipt("urn:way:buffered", 1)
    with pytest.raises(InvalidTransition):
        engine.destination._received_after_failure(item, engine.invoker, RuntimeError("the application"))
    assert item.state == MessageState.initial()
    assert engine.invoker.message_state(engine.destination._taken_message(item)) == MessageState.initial()
