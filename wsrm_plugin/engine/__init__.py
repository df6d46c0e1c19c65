"""The WS-RM engine: RM Source and RM Destination, their workers, and the HTTP transport.

It moves SOAP envelopes from a source store to a destination store and on to
the application exactly once and in order, whatever the network does, with
all state in a store that can join an XA transaction.  It is independent of
spyne and zeep (the interceptors adapt it to them): its unit of work is an
envelope as bytes.

The parts, after Apache CXF's ``rt/ws/rm``:

* :mod:`.policy` - :class:`RMPolicy`, every knob and limit;
* :mod:`.source` - the RM Source (``send``, sequences, acknowledgements);
* :mod:`.destination` - the RM Destination (CreateSequence, messages, Close, Terminate);
* :mod:`.inbound` - reading received envelopes and routing their parts;
* :mod:`.retransmission` - the RMS worker (CreateSequence, (re)transmission, Close, Terminate);
* :mod:`.acknowledgement` - the RMD worker (standalone acks, inactivity, release);
* :mod:`.invoker` - the invoker worker (delivery in a transaction);
* :mod:`.backchannel` - replies in HTTP responses, for clients without a listener;
* :mod:`.transport` - ``Transport``/``HttpTransport`` and the WSGI ``RMEndpoint``;
* :mod:`.http_server` - ``HttpServer``, the built-in server (waitress), and what it survives;
* :mod:`.reachability` - which peers the source can reach (one probe to a peer that is down);
* :mod:`.engine` - :class:`ReliableEngine`, all of it together.
"""

from .destination import Accepted, Destination
from .engine import EngineStatus, ReliableEngine
from .inbound import Inbound, read_message
from .invoker import ApplicationFault, DeliveryContext, FailedDelivery
from .policy import AckRequestMode, DeliveryAssurance, RMPolicy
from .source import FailedMessage, ReceiptAtCommit, ReceiptNotNumbered, SendReceipt, SequenceFault, Source
from .transport import (
    BasicAuth, HttpServer, HttpServerFailed, HttpTransport, Reply, Response, RMEndpoint, Transport, TransportError,
)

__all__ = [
    "ReliableEngine", "EngineStatus", "RMPolicy", "DeliveryAssurance", "AckRequestMode",
    "Source", "SendReceipt", "ReceiptAtCommit", "ReceiptNotNumbered", "SequenceFault", "FailedMessage",
    "Destination", "Accepted", "Inbound", "read_message", "ApplicationFault", "DeliveryContext", "FailedDelivery",
    "Transport", "TransportError", "HttpTransport", "Response", "Reply", "RMEndpoint", "HttpServer",
    "HttpServerFailed",
    "BasicAuth",
]
