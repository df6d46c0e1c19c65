"""The WS-RM wire format: build and read WS-RM 1.0/1.1, WS-Addressing 2004/08 and
2005/08, WS-MakeConnection and SOAP 1.1/1.2 messages with lxml.

Nothing here knows about spyne or zeep, HTTP or the store: it turns bytes into
objects and objects into elements, and every problem in received input is raised
as a :class:`~wsrm_plugin.wire.faults.SoapFault` that renders the fault to send.

A typical read::

    envelope = parse_envelope(data, max_size=limit)
    addressing = AddressingHeaders.from_header(envelope.headers)
    for header in envelope.headers:
        parsed = parse_rm_element(header)      # (SequenceHeader(...), RM11) or None
"""

from .addressing import AddressingHeaders, EndpointReference, new_message_id
from .faults import (
    ActionNotSupported, CreateSequenceRefused, DestinationUnreachable, EndpointUnavailable,
    InvalidAcknowledgement, InvalidAddressingHeader, InvalidMessageNumber,
    LastMessageNumberExceeded, MalformedMessageError, MessageAddressingHeaderRequired,
    MessageNumberRollover, MessageTooLargeError, MissingSelection, MustUnderstandFault,
    SequenceClosed, SequenceTerminated, SoapFault, UnknownSequence, UnsafeXMLError,
    UnsupportedSelection, VersionMismatchFault, WireError, WSAddressingFault, WSMCFault,
    WSRMFault, WSRMRequired,
)
from .mc import MakeConnection, MessagePending
from .namespaces import (
    MAKE_CONNECTION_ACTION, MAX_MESSAGE_NUMBER, RM10, RM11, SOAP11, SOAP12, WSA_2004_08,
    WSA_2005_08, WSMC_NS, AddressingVersion, RMVersion, SoapVersion, mc_anonymous_id,
    mc_anonymous_uri,
)
from .rm import (
    AckRequested, CloseSequence, CloseSequenceResponse, CreateSequence, CreateSequenceResponse,
    Offer, SequenceAcknowledgement, SequenceHeader, TerminateSequence, TerminateSequenceResponse,
    format_duration, parse_duration, parse_message_number, parse_rm_element,
)
from .soap import (
    Envelope, build_envelope, fault_envelope, parse_envelope, parse_fault, to_bytes,
)
from .xmlsafe import DEFAULT_MAX_SIZE, parse_xml

__all__ = [
    # versions and names
    "SoapVersion", "SOAP11", "SOAP12", "AddressingVersion", "WSA_2004_08", "WSA_2005_08",
    "RMVersion", "RM10", "RM11", "WSMC_NS", "MAKE_CONNECTION_ACTION", "MAX_MESSAGE_NUMBER",
    "mc_anonymous_uri", "mc_anonymous_id",
    # parsing and envelopes
    "DEFAULT_MAX_SIZE", "parse_xml", "Envelope", "parse_envelope", "build_envelope",
    "fault_envelope", "to_bytes", "parse_fault",
    # WS-Addressing
    "AddressingHeaders", "EndpointReference", "new_message_id",
    # WS-RM
    "CreateSequence", "Offer", "CreateSequenceResponse", "SequenceHeader",
    "SequenceAcknowledgement", "AckRequested", "CloseSequence", "CloseSequenceResponse",
    "TerminateSequence", "TerminateSequenceResponse", "parse_rm_element",
    "parse_message_number", "parse_duration", "format_duration",
    # WS-MakeConnection
    "MakeConnection", "MessagePending",
    # faults
    "WireError", "SoapFault", "MalformedMessageError", "UnsafeXMLError", "MessageTooLargeError",
    "InvalidMessageNumber", "MustUnderstandFault", "VersionMismatchFault",
    "WSRMFault", "SequenceTerminated", "UnknownSequence", "InvalidAcknowledgement",
    "MessageNumberRollover", "LastMessageNumberExceeded", "CreateSequenceRefused",
    "SequenceClosed", "WSRMRequired",
    "WSAddressingFault", "InvalidAddressingHeader", "MessageAddressingHeaderRequired",
    "DestinationUnreachable", "ActionNotSupported", "EndpointUnavailable",
    "WSMCFault", "UnsupportedSelection", "MissingSelection",
]
