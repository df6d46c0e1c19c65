"""Property tests: hostile input only ever raises the package's declared errors, every
fault raised on input can be sent back, and random valid objects round-trip."""

from __future__ import annotations

import copy
import re

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lxml import etree

from wsrm_plugin.wire import (
    MAX_MESSAGE_NUMBER, RM10, RM11, SOAP11, SOAP12, WSA_2004_08, WSA_2005_08, AckRequested,
    AddressingHeaders, CloseSequence, CloseSequenceResponse, CreateSequence, CreateSequenceResponse,
    EndpointReference, InvalidAcknowledgement, MakeConnection, MessagePending, Offer,
    SequenceAcknowledgement, SequenceHeader, SequenceTerminated, SoapFault, TerminateSequence,
    TerminateSequenceResponse, UnknownSequence, WireError, WSRMFault, build_envelope,
    fault_envelope, mc_anonymous_uri, parse_envelope, parse_rm_element, parse_xml, to_bytes,
)
from wsrm_plugin.wire.faults import RM_FAULT_CLASSES

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
MC_TAGS = {MakeConnection("x").to_xml().tag: MakeConnection, MessagePending(True).to_xml().tag: MessagePending}


def read_everything(data: bytes) -> None:
    """Everything a receiver does with a message's bytes before the engine sees it."""
    envelope = parse_envelope(data, max_size=64 * 1024)
    AddressingHeaders.from_header(envelope.headers)
    for element in [*envelope.headers, *envelope.body]:
        parse_rm_element(element)
        if element.tag in MC_TAGS:
            MC_TAGS[element.tag].from_xml(element)
    envelope.fault()


def assert_only_declared_errors(data: bytes) -> None:
    try:
        read_everything(data)
    except WireError as error:
        assert isinstance(error, SoapFault)
        # Whatever was raised must be sendable, and read back as the same kind of fault.
        for soap in (SOAP11, SOAP12):
            sent = to_bytes(fault_envelope(error, soap))
            received = parse_envelope(sent).fault()
            assert received.code == error.code
            if isinstance(error, WSRMFault):
                assert type(received) is type(error) and received.identifier == error.identifier


# -- a corpus of valid messages to mutate ------------------------------------------------------

def _corpus() -> list[bytes]:
    acks = EndpointReference("http://client.example/acks")
    messages = []
    for version, wsa, soap in ((RM10, WSA_2004_08, SOAP11), (RM10, WSA_2005_08, SOAP12),
                               (RM11, WSA_2005_08, SOAP12), (RM11, WSA_2005_08, SOAP11)):
        addressing = AddressingHeaders(
            to="http://server.example/s", action="urn:a", message_id="urn:uuid:1",
            relates_to="urn:uuid:0", reply_to=acks, fault_to=acks, version=wsa).to_elements(soap=soap)
        headers = [
            *addressing,
            SequenceHeader("urn:uuid:seq", 42, last_message=not version.is_11).to_xml(version, soap),
            SequenceAcknowledgement("urn:uuid:seq", [(1, 3), (5, 9)],
                                    final=version.is_11).to_xml(version, soap),
            AckRequested("urn:uuid:seq", None if version.is_11 else 9).to_xml(version, soap),
            MessagePending(True).to_xml(),
        ]
        offer = Offer("urn:uuid:offer", acks if version.is_11 else None, "PT1H")
        bodies = [
            CreateSequence(acks, "PT10M", offer).to_xml(version, wsa),
            CreateSequenceResponse("urn:uuid:seq", "P1D", None, acks).to_xml(version, wsa),
            TerminateSequence("urn:uuid:seq", 12 if version.is_11 else None).to_xml(version),
            MakeConnection(mc_anonymous_uri("c1")).to_xml(),
        ]
        if version.is_11:
            bodies.append(CloseSequence("urn:uuid:seq", 12).to_xml(version))
        for body in bodies:
            messages.append(to_bytes(build_envelope(soap, headers, body)))
        ack = SequenceAcknowledgement("urn:uuid:seq", [(1, 2)]).to_xml(version)
        for fault in (UnknownSequence("urn:uuid:seq", version=version),
                      InvalidAcknowledgement("urn:uuid:seq", version=version, detail=[ack])):
            messages.append(to_bytes(fault_envelope(fault, soap, addressing)))
    return messages


CORPUS = _corpus()
TOKENS = [b"0", b"-1", b"9223372036854775808", b"99999999999999999999999", b"<", b">", b"&", b"&amp;",
          b"&lol;", b"<!DOCTYPE x>", b"<!-- c -->", b"<![CDATA[x]]>", b"\x00", b"\xff\xfe", b"</",
          b"/>", b"wsrm:", b"xmlns:wsrm='urn:other'", b" Upper='x'", b"<wsrm:Final/>", b"<wsrm:None/>",
          b"soap:", b"\xe2\x80\x8b", b"'", b'"', b"Identifier", b"=", b"1", b""]
_NUMBERS = re.compile(rb">(\d+)<|\"(\d+)\"")


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["flip", "delete", "insert", "duplicate", "number"]))
        at = draw(st.integers(0, len(data)))
        if operation == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif operation == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        elif operation == "insert":
            data[at:at] = draw(st.sampled_from(TOKENS) | st.binary(max_size=8))
        elif operation == "duplicate":
            data[at:at] = data[at:at + draw(st.integers(1, 60))]
        elif operation == "number":
            matches = list(_NUMBERS.finditer(bytes(data)))
            if matches:
                match = draw(st.sampled_from(matches))
                group = 1 if match.group(1) is not None else 2
                value = draw(st.integers(-(10**25), 10**25))
                data[match.start(group):match.end(group)] = str(value).encode()
    return bytes(data)


TEXTS = ["", " ", "0", "-3", "7", "9223372036854775807", "9223372036854775808", "x", "wsrm:Nope",
         "soap:Sender", "PT", "true", "maybe", "http://www.w3.org/2005/08/addressing/anonymous"]


@st.composite
def tree_mutated(draw) -> bytes:
    """Well-formed mutations (drop, duplicate, move, retext elements) that reach the protocol code."""
    root = etree.fromstring(draw(st.sampled_from(CORPUS)))
    for _ in range(draw(st.integers(1, 3))):
        elements = [e for e in root.iter() if e is not root]
        if not elements:
            break
        target = draw(st.sampled_from(elements))
        parent = target.getparent()
        operation = draw(st.sampled_from(["drop", "duplicate", "retext", "attribute", "move"]))
        if operation == "drop":
            parent.remove(target)
        elif operation == "duplicate":
            parent.insert(parent.index(target), copy.deepcopy(target))
        elif operation == "retext":
            target.text = draw(st.sampled_from(TEXTS))
        elif operation == "attribute":
            name = draw(st.sampled_from(["Upper", "Lower", "pending", "RelationshipType",
                                         "{%s}mustUnderstand" % SOAP12.ns,
                                         "{%s}IsReferenceParameter" % WSA_2005_08.ns]))
            target.set(name, draw(st.sampled_from(TEXTS)))
        elif operation == "move":
            inside = set(target.iter())
            destination = draw(st.sampled_from([e for e in root.iter() if e not in inside]))
            parent.remove(target)
            destination.insert(0, target)
    return etree.tostring(root)


def test_corpus_is_valid():
    for data in CORPUS:
        read_everything(data) if b"Fault" not in data else parse_envelope(data).fault()


@SETTINGS
@given(st.binary(max_size=2000))
def test_random_bytes_raise_only_declared_errors(data):
    assert_only_declared_errors(data)


@SETTINGS
@given(st.binary(max_size=400))
def test_random_body_content_raises_only_declared_errors(data):
    assert_only_declared_errors(
        b'<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope"><s:Body>' + data
        + b"</s:Body></s:Envelope>")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_valid_messages_raise_only_declared_errors(data):
    assert_only_declared_errors(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree_mutated())
def test_well_formed_mutations_raise_only_declared_errors(data):
    assert_only_declared_errors(data)


# -- random valid objects round-trip ----------------------------------------------------------

# Text that survives XML as-is: no control or unassigned characters, no surrounding
# whitespace (schema whitespace collapsing strips it, by design).
TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cn", "Zl", "Zp")),
               min_size=1, max_size=24).filter(lambda s: s == s.strip())
NUMBERS = st.integers(1, MAX_MESSAGE_NUMBER)
DURATIONS = st.sampled_from(["PT0S", "PT10M", "P1D", "P1Y2M3DT4H5M6.5S", "-PT1S"])
BEHAVIORS = st.sampled_from(["DiscardEntireSequence", "DiscardFollowingFirstGap", "NoDiscard"])


@st.composite
def parameters(draw) -> list[etree._Element]:
    elements = []
    for text in draw(st.lists(TEXT, max_size=2)):
        element = etree.Element("{urn:app}P", nsmap={"app": "urn:app"})
        element.text = text
        elements.append(element)
    return elements


@st.composite
def endpoints(draw) -> EndpointReference:
    return EndpointReference(draw(TEXT), draw(parameters()))


@st.composite
def ranges(draw) -> list[tuple[int, int]]:
    pairs = draw(st.lists(st.tuples(NUMBERS, NUMBERS), max_size=4))
    return [(min(a, b), max(a, b)) for a, b in pairs]


@st.composite
def rm_objects(draw):
    version, wsa = draw(st.sampled_from([(RM10, WSA_2004_08), (RM10, WSA_2005_08), (RM11, WSA_2005_08)]))
    is_11 = version.is_11
    optional = lambda strategy: draw(st.none() | strategy)  # noqa: E731
    ident = draw(TEXT)
    choices = [
        lambda: CreateSequence(draw(endpoints()), optional(DURATIONS), optional(st.builds(
            Offer, TEXT, endpoints() if is_11 else st.none(), st.none() | DURATIONS,
            (st.none() | BEHAVIORS) if is_11 else st.none()))),
        lambda: CreateSequenceResponse(ident, optional(DURATIONS),
                                       optional(BEHAVIORS) if is_11 else None, optional(endpoints())),
        lambda: SequenceHeader(ident, draw(NUMBERS), draw(st.booleans()) and not is_11),
        lambda: SequenceAcknowledgement(ident, draw(ranges().filter(lambda r: r or is_11)),
                                        final=draw(st.booleans()) and is_11),
        lambda: SequenceAcknowledgement(ident, nacks=draw(st.lists(NUMBERS, min_size=1, max_size=4))),
        lambda: AckRequested(ident, None if is_11 else optional(NUMBERS)),
        lambda: TerminateSequence(ident, optional(NUMBERS) if is_11 else None),
    ]
    if is_11:
        choices += [
            lambda: CloseSequence(ident, optional(NUMBERS)),
            lambda: CloseSequenceResponse(ident),
            lambda: TerminateSequenceResponse(ident),
        ]
    obj = draw(st.sampled_from(choices))()
    return obj, version, wsa


@SETTINGS
@given(rm_objects(), st.sampled_from([None, SOAP11, SOAP12]))
def test_random_rm_objects_round_trip(case, soap):
    obj, version, wsa = case
    if isinstance(obj, (CreateSequence, CreateSequenceResponse)):
        element = obj.to_xml(version, wsa)
    elif isinstance(obj, (SequenceHeader, SequenceAcknowledgement, AckRequested)):
        element = obj.to_xml(version, soap)
    else:
        element = obj.to_xml(version)
    assert parse_rm_element(parse_xml(etree.tostring(element))) == (obj, version)


@SETTINGS
@given(st.sampled_from([WSA_2004_08, WSA_2005_08]), st.builds(
    AddressingHeaders, to=st.none() | TEXT, action=st.none() | TEXT, message_id=st.none() | TEXT,
    relates_to=st.none() | TEXT, reply_to=st.none() | endpoints(), fault_to=st.none() | endpoints(),
    from_=st.none() | endpoints(), reference_parameters=parameters()))
def test_random_addressing_headers_round_trip(wsa, headers):
    headers.version = wsa
    envelope = parse_envelope(to_bytes(build_envelope(SOAP12, headers.to_elements())))
    read = AddressingHeaders.from_header(envelope.headers)
    if wsa is WSA_2004_08:
        headers.reference_parameters = []  # no IsReferenceParameter marker in 2004/08
    assert read == headers


@SETTINGS
@given(st.sampled_from(sorted(RM_FAULT_CLASSES)), st.sampled_from([RM10, RM11]),
       st.sampled_from([SOAP11, SOAP12]), st.none() | TEXT, TEXT)
def test_random_rm_faults_round_trip(code, version, soap, identifier, reason):
    assume(code in version.fault_codes)
    fault = RM_FAULT_CLASSES[code](identifier, reason, version=version)
    read = parse_envelope(to_bytes(fault_envelope(fault, soap))).fault()
    assert type(read) is type(fault)
    assert (read.identifier, read.reason, read.version) == (identifier, reason, version)
    if soap is SOAP12:
        assert read.code == fault.code


def test_sequence_terminated_and_unknown_sequence_are_registered():
    assert RM_FAULT_CLASSES["SequenceTerminated"] is SequenceTerminated
    assert RM_FAULT_CLASSES["UnknownSequence"] is UnknownSequence
