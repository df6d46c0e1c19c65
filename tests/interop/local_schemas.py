"""Load the gSOAP peer's WSDL in zeep without the network: its schema imports resolved locally.

soapcpp2 writes ``<import namespace="..." schemaLocation="http://..."/>`` for
WS-Addressing, WS-RM and Microsoft's duplex namespace, pointing at the
namespace URIs themselves.  zeep would fetch them over HTTP; the tests run
offline (and must not depend on third-party web sites), so
:class:`LocalSchemaTransport` answers those loads from the copies of the
published schemas in ``tests/wire/schemas`` -- an XML catalog, in effect.
Anything else remote is refused with a message saying which URL was asked
for, rather than silently fetched.
"""

from __future__ import annotations

from pathlib import Path

import zeep
from zeep.transports import Transport

from tests.interop.gsoap_peer import GsoapPeer

__all__ = ["LocalSchemaTransport", "gsoap_zeep_client", "SCHEMA_DIR"]

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "wire" / "schemas"

#: The duplex namespace soapcpp2 imports for WCF's ``chan:ChannelInstance`` header.  No
#: schema for it is published; the peer's messages never carry it, so a declaration of
#: that one element is all zeep needs to read the WSDL's header message.
_DUPLEX_NS = "http://schemas.microsoft.com/ws/2005/02/duplex"
_DUPLEX_SCHEMA = (
    '<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" elementFormDefault="qualified" '
    f'targetNamespace="{_DUPLEX_NS}"><xs:element name="ChannelInstance" type="xs:int"/></xs:schema>'
).encode()

#: schemaLocation (as the peer's WSDL writes it) -> local file in SCHEMA_DIR.
_CATALOG = {
    "http://www.w3.org/2005/08/addressing": "ws-addressing-200508.xsd",
    "http://docs.oasis-open.org/ws-rx/wsrm/200702": "wsrm-200702.xsd",
    # the 1.0 peer pairs WS-RM 2005/02 with WS-Addressing 2005/08
    "http://schemas.xmlsoap.org/ws/2005/02/rm": "wsrm-200502-wsa200508.xsd",
}


class LocalSchemaTransport(Transport):
    """A zeep transport that loads the peer WSDL's schema imports from local files.

    Relative imports inside those schemas (``schemaLocation="ws-addressing-200508.xsd"``)
    resolve against the remote URL; they are served from :data:`SCHEMA_DIR` by file name.
    Only loading is affected: SOAP requests are posted as usual.
    """

    def load(self, url: str) -> bytes:
        if url == _DUPLEX_NS:
            return _DUPLEX_SCHEMA
        if url in _CATALOG:
            return (SCHEMA_DIR / _CATALOG[url]).read_bytes()
        if url.startswith(("http://", "https://")):
            name = url.rsplit("/", 1)[-1]
            if name.endswith(".xsd") and (SCHEMA_DIR / name).is_file():
                return (SCHEMA_DIR / name).read_bytes()
            raise OSError(f"the interop tests load no remote documents, and {url} has no local copy "
                          f"in {SCHEMA_DIR}: add one (and map it in {__name__})")
        return super().load(url)


def gsoap_zeep_client(peer: GsoapPeer, address: str) -> zeep.Client:
    """A zeep client built from the peer's own WSDL, posting to ``address``.

    The WSDL's ``soap:address`` is soapcpp2's placeholder (``http://127.0.0.1:8080/``);
    the running server's URL replaces it in the default service's binding options.
    """
    client = zeep.Client(str(peer.wsdl), transport=LocalSchemaTransport())
    client.service._binding_options["address"] = address
    return client
