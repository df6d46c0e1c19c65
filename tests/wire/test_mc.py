"""WS-MakeConnection: MakeConnection, MessagePending and the anonymous URI template."""

from __future__ import annotations

import pytest
from lxml import etree

from tests.wire import assert_valid
from wsrm_plugin.wire import (
    MAKE_CONNECTION_ACTION, RM11, SOAP12, WSA_2005_08, WSMC_NS, MakeConnection,
    MalformedMessageError, MessagePending, MissingSelection, UnsupportedSelection, build_envelope,
    mc_anonymous_id, mc_anonymous_uri, parse_xml,
)


def _roundtrip(element: etree._Element) -> etree._Element:
    return parse_xml(etree.tostring(element))


def test_make_connection_validates_and_round_trips():
    request = MakeConnection(mc_anonymous_uri("c0ffee"))
    element = request.to_xml()
    assert_valid(element, RM11.ns, WSA_2005_08.ns)
    assert_valid(build_envelope(SOAP12, body=element), RM11.ns, WSA_2005_08.ns)
    assert MakeConnection.from_xml(_roundtrip(element)) == request
    assert MAKE_CONNECTION_ACTION == WSMC_NS + "/MakeConnection"


@pytest.mark.parametrize("pending", [True, False])
def test_message_pending_validates_and_round_trips(pending):
    element = MessagePending(pending).to_xml()
    assert_valid(element, RM11.ns, WSA_2005_08.ns)
    assert MessagePending.from_xml(_roundtrip(element)) == MessagePending(pending)


@pytest.mark.parametrize("raw, value", [("1", True), ("0", False), (" true ", True)])
def test_message_pending_reads_every_boolean_spelling(raw, value):
    element = etree.fromstring(f'<wsmc:MessagePending xmlns:wsmc="{WSMC_NS}" pending="{raw}"/>')
    assert MessagePending.from_xml(element).pending is value


def test_message_pending_garbage_is_malformed():
    element = etree.fromstring(f'<wsmc:MessagePending xmlns:wsmc="{WSMC_NS}" pending="maybe"/>')
    with pytest.raises(MalformedMessageError):
        MessagePending.from_xml(element)


def test_make_connection_without_selection_is_missing_selection():
    with pytest.raises(MissingSelection):
        MakeConnection.from_xml(etree.fromstring(f'<wsmc:MakeConnection xmlns:wsmc="{WSMC_NS}"/>'))


def test_make_connection_with_only_unknown_selection_is_unsupported_selection():
    element = etree.fromstring(
        f'<wsmc:MakeConnection xmlns:wsmc="{WSMC_NS}" xmlns:wsrm="{RM11.ns}">'
        '<wsrm:Identifier>urn:s</wsrm:Identifier></wsmc:MakeConnection>')
    with pytest.raises(UnsupportedSelection, match="Identifier"):
        MakeConnection.from_xml(element)


def test_make_connection_ignores_extensions_next_to_an_address():
    element = etree.fromstring(
        f'<wsmc:MakeConnection xmlns:wsmc="{WSMC_NS}" xmlns:x="urn:x">'
        '<wsmc:Address> http://a </wsmc:Address><x:Extra/></wsmc:MakeConnection>')
    assert MakeConnection.from_xml(element) == MakeConnection("http://a")


def test_wrong_element_is_malformed():
    with pytest.raises(MalformedMessageError):
        MakeConnection.from_xml(etree.fromstring("<x/>"))
    with pytest.raises(MalformedMessageError):
        MessagePending.from_xml(etree.fromstring("<x/>"))


def test_anonymous_uri_template():
    uri = mc_anonymous_uri("abc")
    assert uri == "http://docs.oasis-open.org/ws-rx/wsmc/200702/anonymous?id=abc"
    assert mc_anonymous_id(uri) == "abc"
    assert mc_anonymous_id(WSA_2005_08.anonymous) is None and mc_anonymous_id(None) is None
    with pytest.raises(ValueError):
        mc_anonymous_uri("")
