"""WS-RM 1.0/1.1 elements: schema validity, round trips, peer quirks, precise errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
from lxml import etree

from tests.wire import assert_valid
from wsrm_plugin.wire import (
    MAX_MESSAGE_NUMBER, RM10, RM11, SOAP11, SOAP12, WSA_2004_08, WSA_2005_08,
    AckRequested, CloseSequence, CloseSequenceResponse, CreateSequence, CreateSequenceResponse,
    EndpointReference, InvalidAcknowledgement, InvalidMessageNumber, MalformedMessageError,
    MessageNumberRollover, Offer, SequenceAcknowledgement, SequenceHeader, TerminateSequence,
    TerminateSequenceResponse, build_envelope, format_duration, parse_duration, parse_envelope,
    parse_rm_element, parse_xml, to_bytes,
)
from wsrm_plugin.wire.rm import expires_after

PAIRS = [(RM10, WSA_2004_08), (RM10, WSA_2005_08), (RM11, WSA_2005_08)]
PAIR_IDS = ["rm10-wsa2004", "rm10-wsa2005", "rm11-wsa2005"]


def _param() -> etree._Element:
    element = etree.Element("{urn:app}Key", nsmap={"app": "urn:app"})
    element.text = "42"
    return element


def samples(version):
    """One or more instances of every element this version has, with every optional part."""
    is_11 = version.is_11
    epr = EndpointReference("http://client.example/acks", [_param()])
    bodies = [
        CreateSequence(EndpointReference("http://client.example/acks")),
        CreateSequence(epr, "PT1H", Offer("urn:uuid:offer-1", epr if is_11 else None, "P1D",
                                          "DiscardFollowingFirstGap" if is_11 else None)),
        CreateSequenceResponse("urn:uuid:seq-1"),
        CreateSequenceResponse("urn:uuid:seq-1", "PT10M", "NoDiscard" if is_11 else None, epr),
        TerminateSequence("urn:uuid:seq-1"),
    ]
    headers = [
        SequenceHeader("urn:uuid:seq-1", 1),
        SequenceHeader("opaque-7f3a", MAX_MESSAGE_NUMBER),
        SequenceAcknowledgement("urn:uuid:seq-1", [(1, 3), (5, 9)]),
        SequenceAcknowledgement("urn:uuid:seq-1", nacks=[4, 10]),
        AckRequested("urn:uuid:seq-1"),
    ]
    if is_11:
        bodies += [
            TerminateSequence("urn:uuid:seq-1", 12),
            CloseSequence("urn:uuid:seq-1"),
            CloseSequence("urn:uuid:seq-1", 5),
            CloseSequenceResponse("urn:uuid:seq-1"),
            TerminateSequenceResponse("urn:uuid:seq-1"),
        ]
        headers += [
            SequenceAcknowledgement("urn:uuid:seq-1", [(1, 1)], final=True),
            SequenceAcknowledgement("urn:uuid:seq-1"),
            SequenceAcknowledgement("urn:uuid:seq-1", final=True),
        ]
    else:
        headers += [
            SequenceHeader("urn:uuid:seq-1", 9, last_message=True),
            AckRequested("urn:uuid:seq-1", 7),
        ]
    return bodies, headers


def _render(obj, version, wsa, soap=None):
    if isinstance(obj, (CreateSequence, CreateSequenceResponse)):
        return obj.to_xml(version, wsa)
    if isinstance(obj, (SequenceHeader, SequenceAcknowledgement, AckRequested)):
        return obj.to_xml(version, soap)
    return obj.to_xml(version)


@pytest.mark.parametrize("version, wsa", PAIRS, ids=PAIR_IDS)
def test_every_element_validates_and_round_trips(version, wsa):
    bodies, headers = samples(version)
    for obj in [*bodies, *headers]:
        element = _render(obj, version, wsa)
        assert_valid(element, version.ns, wsa.ns)
        reparsed = parse_xml(etree.tostring(element))
        assert type(obj).from_xml(reparsed) == (obj, version)
        assert parse_rm_element(reparsed) == (obj, version)


@pytest.mark.parametrize("soap", [SOAP11, SOAP12], ids=["soap11", "soap12"])
@pytest.mark.parametrize("version, wsa", PAIRS, ids=PAIR_IDS)
def test_elements_in_envelopes_validate_and_round_trip(version, wsa, soap):
    bodies, headers = samples(version)
    header_elements = [_render(h, version, wsa, soap) for h in headers]
    for body in bodies:
        envelope = build_envelope(soap, header_elements, _render(body, version, wsa))
        assert_valid(envelope, version.ns, wsa.ns)
        read = parse_envelope(to_bytes(envelope))
        assert read.version is soap
        assert parse_rm_element(read.body_element) == (body, version)
        assert [parse_rm_element(h) for h in read.headers] == [(h, version) for h in headers]


@pytest.mark.parametrize("soap", [SOAP11, SOAP12])
def test_headers_carry_must_understand_in_each_soap_spelling(soap):
    element = SequenceHeader("s", 1).to_xml(RM11, soap)
    assert element.get(f"{{{soap.ns}}}mustUnderstand") == soap.must_understand_true
    assert SequenceHeader("s", 1).to_xml(RM11).get(f"{{{soap.ns}}}mustUnderstand") is None


# -- quirks of real peers -------------------------------------------------------------

def _xml(text: str) -> etree._Element:
    return parse_xml(text.encode())


def test_gsoap_sequence_without_must_understand_and_opaque_identifier():
    element = _xml(f'<wsrm:Sequence xmlns:wsrm="{RM10.ns}">'
                   '<wsrm:Identifier>7f3a9c 0001</wsrm:Identifier>'
                   '<wsrm:MessageNumber>3</wsrm:MessageNumber></wsrm:Sequence>')
    assert SequenceHeader.from_xml(element) == (SequenceHeader("7f3a9c 0001", 3), RM10)


def test_final_before_ranges_is_accepted():
    element = _xml(f'<wsrm:SequenceAcknowledgement xmlns:wsrm="{RM11.ns}">'
                   '<wsrm:Identifier>s</wsrm:Identifier><wsrm:Final/>'
                   '<wsrm:AcknowledgementRange Upper="3" Lower="1"/>'
                   '<wsrm:AcknowledgementRange Lower="5" Upper="5"/>'
                   '</wsrm:SequenceAcknowledgement>')
    assert SequenceAcknowledgement.from_xml(element) == (
        SequenceAcknowledgement("s", [(1, 3), (5, 5)], final=True), RM11)


def test_rm10_with_w3c_addressing_as_gsoap_and_wcf_send_it():
    element = _xml(f'<wsrm:CreateSequence xmlns:wsrm="{RM10.ns}" xmlns:wsa="{WSA_2005_08.ns}">'
                   f'<wsrm:AcksTo><wsa:Address>{WSA_2005_08.anonymous}</wsa:Address></wsrm:AcksTo>'
                   '</wsrm:CreateSequence>')
    parsed, version = CreateSequence.from_xml(element)
    assert version is RM10 and parsed.acks_to.is_anonymous


def test_unknown_extensions_attributes_and_whitespace_are_tolerated():
    element = _xml(f'<wsrm:Sequence xmlns:wsrm="{RM11.ns}" xmlns:ext="urn:ext" ext:flag="1">'
                   '<wsrm:Identifier ext:a="b">\n  urn:s  \n</wsrm:Identifier>'
                   '<wsrm:MessageNumber> +007 </wsrm:MessageNumber>'
                   '<ext:Thing><ext:Deep/></ext:Thing><wsrm:FutureElement/></wsrm:Sequence>')
    assert SequenceHeader.from_xml(element) == (SequenceHeader("urn:s", 7), RM11)


def test_rm10_ack_requested_reads_message_number_spelling_too():
    element = _xml(f'<wsrm:AckRequested xmlns:wsrm="{RM10.ns}"><wsrm:Identifier>s</wsrm:Identifier>'
                   '<wsrm:MessageNumber>4</wsrm:MessageNumber></wsrm:AckRequested>')
    assert AckRequested.from_xml(element) == (AckRequested("s", 4), RM10)


def test_rm10_ack_requested_writes_the_schema_name():
    element = AckRequested("s", 4).to_xml(RM10)
    assert element[1].tag == f"{{{RM10.ns}}}MaxMessageNumberUsed"


def test_reference_properties_of_2004_addressing_round_trip():
    epr = EndpointReference("http://x", reference_properties=[_param()])
    element = CreateSequence(epr).to_xml(RM10, WSA_2004_08)
    assert_valid(element, RM10.ns, WSA_2004_08.ns)
    assert CreateSequence.from_xml(parse_xml(etree.tostring(element)))[0].acks_to == epr


# -- precise errors ---------------------------------------------------------------------

def _sequence(number: str, version=RM11) -> etree._Element:
    return _xml(f'<wsrm:Sequence xmlns:wsrm="{version.ns}"><wsrm:Identifier>urn:s</wsrm:Identifier>'
                f'<wsrm:MessageNumber>{number}</wsrm:MessageNumber></wsrm:Sequence>')


@pytest.mark.parametrize("number", ["0", "000", "-1", "-0", "abc", "", "1.5", "1e3", "\uff11", "0x10"])
def test_invalid_message_numbers_are_sender_faults(number):
    with pytest.raises(InvalidMessageNumber) as info:
        SequenceHeader.from_xml(_sequence(number))
    fault = info.value
    assert isinstance(fault, MalformedMessageError) and fault.code == "Sender"
    assert fault.identifier == "urn:s" and fault.field == "MessageNumber"


@pytest.mark.parametrize("version", [RM10, RM11])
@pytest.mark.parametrize("number", [str(2**63), str(2**64), "9" * 30, "9" * 5000])
def test_numbers_beyond_xs_long_are_message_number_rollover(number, version):
    with pytest.raises(MessageNumberRollover) as info:
        SequenceHeader.from_xml(_sequence(number, version))
    fault = info.value
    assert fault.identifier == "urn:s" and fault.version is version
    assert fault.fault_code == "MessageNumberRollover"


def test_largest_message_number_is_accepted():
    assert SequenceHeader.from_xml(_sequence(str(2**63 - 1)))[0].message_number == 2**63 - 1


def test_missing_message_number_is_an_invalid_message_number():
    element = _xml(f'<wsrm:Sequence xmlns:wsrm="{RM11.ns}"><wsrm:Identifier>s</wsrm:Identifier></wsrm:Sequence>')
    with pytest.raises(InvalidMessageNumber, match="missing MessageNumber in sequence .s."):
        SequenceHeader.from_xml(element)


def test_last_msg_number_errors_name_the_field():
    element = _xml(f'<wsrm:CloseSequence xmlns:wsrm="{RM11.ns}"><wsrm:Identifier>s</wsrm:Identifier>'
                   '<wsrm:LastMsgNumber>0</wsrm:LastMsgNumber></wsrm:CloseSequence>')
    with pytest.raises(InvalidMessageNumber) as info:
        CloseSequence.from_xml(element)
    assert info.value.field == "LastMsgNumber"


def _ack(inner: str, version=RM11) -> etree._Element:
    return _xml(f'<wsrm:SequenceAcknowledgement xmlns:wsrm="{version.ns}">'
                f'<wsrm:Identifier>urn:s</wsrm:Identifier>{inner}</wsrm:SequenceAcknowledgement>')


@pytest.mark.parametrize("inner", [
    '<wsrm:AcknowledgementRange Upper="1" Lower="3"/>',
    '<wsrm:AcknowledgementRange Upper="3" Lower="0"/>',
    '<wsrm:AcknowledgementRange Lower="1"/>',
    '<wsrm:AcknowledgementRange Upper="x" Lower="1"/>',
    f'<wsrm:AcknowledgementRange Upper="{2**63}" Lower="1"/>',
    '<wsrm:AcknowledgementRange Upper="3" Lower="1"/><wsrm:Nack>5</wsrm:Nack>',
    '<wsrm:AcknowledgementRange Upper="3" Lower="1"/><wsrm:None/>',
    '<wsrm:Nack>0</wsrm:Nack>',
    '<wsrm:Nack>4</wsrm:Nack><wsrm:Final/>',
    '',
    '<wsrm:Final/>',
])
def test_impossible_acknowledgements_are_invalid_acknowledgement(inner):
    element = _ack(inner)
    with pytest.raises(InvalidAcknowledgement) as info:
        SequenceAcknowledgement.from_xml(element)
    fault = info.value
    assert fault.identifier == "urn:s" and fault.version is RM11
    # The offending acknowledgement travels as the fault's detail, as the spec says.
    assert [etree.QName(d).localname for d in fault.detail] == ["SequenceAcknowledgement"]


def test_rm10_acknowledgement_of_nothing_is_invalid():
    with pytest.raises(InvalidAcknowledgement):
        SequenceAcknowledgement.from_xml(_ack("", RM10))


@pytest.mark.parametrize("text, why", [
    (f'<wsrm:Sequence xmlns:wsrm="{RM11.ns}"><wsrm:MessageNumber>1</wsrm:MessageNumber></wsrm:Sequence>',
     "no Identifier"),
    (f'<wsrm:Sequence xmlns:wsrm="{RM11.ns}"><wsrm:Identifier> </wsrm:Identifier>'
     '<wsrm:MessageNumber>1</wsrm:MessageNumber></wsrm:Sequence>', "empty Identifier"),
    (f'<wsrm:Sequence xmlns:wsrm="{RM11.ns}"><wsrm:Identifier>a</wsrm:Identifier>'
     '<wsrm:Identifier>b</wsrm:Identifier><wsrm:MessageNumber>1</wsrm:MessageNumber></wsrm:Sequence>',
     "more than one Identifier"),
    (f'<wsrm:CreateSequence xmlns:wsrm="{RM11.ns}"/>', "no AcksTo"),
    (f'<wsrm:CreateSequence xmlns:wsrm="{RM11.ns}"><wsrm:AcksTo/></wsrm:CreateSequence>', "Address"),
    (f'<wsrm:CreateSequence xmlns:wsrm="{RM11.ns}" xmlns:wsa="{WSA_2005_08.ns}">'
     '<wsrm:AcksTo><wsa:Address>http://x</wsa:Address></wsrm:AcksTo>'
     '<wsrm:Offer><wsrm:Identifier>o</wsrm:Identifier></wsrm:Offer></wsrm:CreateSequence>',
     "Endpoint"),
    (f'<wsrm:CreateSequence xmlns:wsrm="{RM11.ns}" xmlns:wsa="{WSA_2005_08.ns}">'
     '<wsrm:AcksTo><wsa:Address>http://x</wsa:Address></wsrm:AcksTo>'
     '<wsrm:Expires>10 minutes</wsrm:Expires></wsrm:CreateSequence>', "Expires"),
    (f'<wsrm:CreateSequenceResponse xmlns:wsrm="{RM11.ns}"><wsrm:Identifier>s</wsrm:Identifier>'
     '<wsrm:IncompleteSequenceBehavior>KeepSome</wsrm:IncompleteSequenceBehavior>'
     '</wsrm:CreateSequenceResponse>', "IncompleteSequenceBehavior"),
    (f'<wsrm:CreateSequenceResponse xmlns:wsrm="{RM11.ns}"><wsrm:Identifier>s</wsrm:Identifier>'
     '<wsrm:Accept/></wsrm:CreateSequenceResponse>', "AcksTo"),
])
def test_malformed_elements_are_sender_faults_saying_what_is_wrong(text, why):
    with pytest.raises(MalformedMessageError, match=why) as info:
        parse_rm_element(_xml(text))
    assert info.value.code == "Sender"


def test_parse_rm_element_ignores_what_is_not_rm():
    assert parse_rm_element(_xml('<a xmlns="urn:x"/>')) is None
    assert parse_rm_element(_xml(f'<wsrm:Unknown xmlns:wsrm="{RM11.ns}"/>')) is None
    # CloseSequence does not exist in 1.0
    assert parse_rm_element(_xml(f'<wsrm:CloseSequence xmlns:wsrm="{RM10.ns}"/>')) is None


def test_from_xml_refuses_the_wrong_element():
    with pytest.raises(MalformedMessageError):
        SequenceHeader.from_xml(_xml(f'<wsrm:AckRequested xmlns:wsrm="{RM11.ns}"/>'))


# -- building what a version cannot say is a programming error --------------------------

@pytest.mark.parametrize("build", [
    lambda: CloseSequence("s").to_xml(RM10),
    lambda: TerminateSequenceResponse("s").to_xml(RM10),
    lambda: TerminateSequence("s", 3).to_xml(RM10),
    lambda: SequenceAcknowledgement("s").to_xml(RM10),
    lambda: SequenceAcknowledgement("s", [(1, 2)], final=True).to_xml(RM10),
    lambda: SequenceHeader("s", 1, last_message=True).to_xml(RM11),
    lambda: AckRequested("s", 3).to_xml(RM11),
    lambda: CreateSequence(EndpointReference("http://x"), offer=Offer("o")).to_xml(RM11),
    lambda: SequenceHeader("s", 0).to_xml(RM11),
    lambda: SequenceHeader("s", 2**63).to_xml(RM11),
    lambda: SequenceHeader("", 1).to_xml(RM11),
    lambda: SequenceAcknowledgement("s", [(3, 1)]).to_xml(RM11),
    lambda: SequenceAcknowledgement("s", [(1, 1)], nacks=[2]).to_xml(RM11),
    lambda: CreateSequenceResponse("s", incomplete_sequence_behavior="NoDiscard").to_xml(RM10),
])
def test_building_what_the_version_cannot_express_raises_value_error(build):
    with pytest.raises(ValueError):
        build()


def test_action_uris():
    assert RM11.create_sequence_action == "http://docs.oasis-open.org/ws-rx/wsrm/200702/CreateSequence"
    assert RM10.action("LastMessage") == "http://schemas.xmlsoap.org/ws/2005/02/rm/LastMessage"
    assert RM11.action("CloseSequenceResponse").endswith("/CloseSequenceResponse")
    assert RM10.fault_action == "http://schemas.xmlsoap.org/ws/2005/02/rm/fault"
    with pytest.raises(ValueError):
        RM10.action("CloseSequence")
    with pytest.raises(ValueError):
        RM11.action("LastMessage")


def test_ranges_from_numbers_and_acknowledges():
    ranges = SequenceAcknowledgement.ranges_from_numbers([5, 1, 2, 3, 3, 9, 10])
    assert ranges == [(1, 3), (5, 5), (9, 10)]
    ack = SequenceAcknowledgement("s", ranges)
    assert ack.acknowledges(2) and ack.acknowledges(10) and not ack.acknowledges(4)


@pytest.mark.parametrize("lower, upper, message", [
    (0, 3, "Lower must be an int from 1"),
    (True, 3, "Lower must be an int from 1"),
    (1.0, 3, "Lower must be an int from 1"),
    ("1", 3, "Lower must be an int from 1"),
    (1, MAX_MESSAGE_NUMBER + 1, "Upper must be an int from 1"),
    (1, False, "Upper must be an int from 1"),
    (4, 3, "Lower 4 > Upper 3"),
], ids=["zero", "bool", "float", "str", "past-max", "bool-upper", "reversed"])
def test_an_acknowledgement_refuses_to_write_a_range_that_is_not_two_numbers_in_order(lower, upper, message):
    # the writer checks the common range (two ints in order) inline and anything else as before
    with pytest.raises(ValueError, match=message):
        SequenceAcknowledgement("s", [(1, 1), (lower, upper)]).to_xml(RM11)
    element = SequenceAcknowledgement("s", [(1, 2), (4, MAX_MESSAGE_NUMBER)]).to_xml(RM11)
    assert [(r.get("Lower"), r.get("Upper")) for r in element[1:]] == [("1", "2"), ("4", str(MAX_MESSAGE_NUMBER))]


# -- durations --------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("PT10M", timedelta(minutes=10)),
    ("P1DT2H", timedelta(days=1, hours=2)),
    ("PT0.5S", timedelta(seconds=0.5)),
    ("-PT5S", timedelta(seconds=-5)),
    ("P1Y2M", timedelta(days=365 + 60)),
    ("PT0S", timedelta(0)),
])
def test_parse_duration(text, value):
    assert parse_duration(text) == value


@pytest.mark.parametrize("text", ["P", "PT", "10M", "P1H", "PT1D", "P1YT", "", "P-1D", "PT1,5S"])
def test_parse_duration_rejects_non_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("value", [timedelta(0), timedelta(minutes=10), timedelta(days=3, seconds=1),
                                   timedelta(seconds=1.25), -timedelta(hours=1)])
def test_format_duration_round_trips(value):
    assert parse_duration(format_duration(value)) == value


def test_expires_pt0s_and_absent_mean_never():
    assert expires_after(None) is None and expires_after("PT0S") is None
    assert CreateSequenceResponse("s", "PT1M").expires_after == timedelta(minutes=1)


@pytest.mark.parametrize("version", [RM10, RM11])
def test_header_blocks_made_from_copies_are_each_their_own(version) -> None:
    """Sequence headers and acknowledgements are copies of a block made once per version: a
    block sent (and changed by a later stamp, or appended to an envelope) never shows in the next."""
    first_ack = SequenceAcknowledgement("urn:uuid:a", ((1, 3),)).to_xml(version, SOAP11)
    first_ack[0].text = "urn:uuid:changed"
    etree.SubElement(first_ack, "extra")
    second_ack = SequenceAcknowledgement("urn:uuid:b", ((5, 5),)).to_xml(version, SOAP11)
    assert [c.text for c in second_ack] == ["urn:uuid:b", None]
    assert second_ack[1].get("Lower") == "5" and len(second_ack) == 2
    first_seq = SequenceHeader("urn:uuid:a", 1).to_xml(version, SOAP12)
    first_seq[1].text = "99"
    envelope = etree.Element("holder")
    envelope.append(first_seq)
    second_seq = SequenceHeader("urn:uuid:b", 2).to_xml(version, SOAP12)
    assert second_seq.getparent() is None
    assert (second_seq[0].text, second_seq[1].text) == ("urn:uuid:b", "2")
    assert second_seq.get(f"{{{SOAP12.ns}}}mustUnderstand") == SOAP12.must_understand_true
