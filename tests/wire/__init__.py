"""Tests of the wire format, and the schema validators they share.

The validators load only the local copies in ``schemas/`` (see its README);
a driver schema imports the SOAP, WS-Addressing, WS-RM and WS-MC schemas of
one version combination, so a whole envelope validates in one go: the SOAP
Header/Body wildcards are lax, which means every child with a known global
declaration is validated strictly.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from lxml import etree

from wsrm_plugin.wire import RM10, RM11, WSA_2004_08, WSA_2005_08

SCHEMAS = Path(__file__).parent / "schemas"

_RM_SCHEMA = {
    (RM10.ns, WSA_2004_08.ns): "wsrm-200502.xsd",
    (RM10.ns, WSA_2005_08.ns): "wsrm-200502-wsa200508.xsd",
    (RM11.ns, WSA_2005_08.ns): "wsrm-200702.xsd",
}
_WSA_SCHEMA = {WSA_2004_08.ns: "ws-addressing-200408.xsd", WSA_2005_08.ns: "ws-addressing-200508.xsd"}


@cache
def validator(rm_ns: str, wsa_ns: str, rm_file: str | None = None) -> etree.XMLSchema:
    """A schema for SOAP 1.1 + 1.2 + WS-MC + this WS-RM/WS-A pair, from local files only."""
    imports = [
        ("http://schemas.xmlsoap.org/soap/envelope/", "soap11-envelope.xsd"),
        ("http://www.w3.org/2003/05/soap-envelope", "soap12-envelope.xsd"),
        ("http://docs.oasis-open.org/ws-rx/wsmc/200702", "wsmc-200702.xsd"),
        (wsa_ns, _WSA_SCHEMA[wsa_ns]),
        (rm_ns, rm_file or _RM_SCHEMA[(rm_ns, wsa_ns)]),
    ]
    driver = (
        '<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:test:driver">'
        + "".join(f'<xs:import namespace="{ns}" schemaLocation="{name}"/>' for ns, name in imports)
        + "</xs:schema>"
    )
    parser = etree.XMLParser(no_network=True, resolve_entities=False)
    document = etree.fromstring(driver.encode(), parser, base_url=str(SCHEMAS / "driver.xsd"))
    return etree.XMLSchema(document)


def assert_valid(element: etree._Element, rm_ns: str, wsa_ns: str, rm_file: str | None = None) -> None:
    schema = validator(rm_ns, wsa_ns, rm_file)
    # Validate a serialized copy: what a peer would receive, with namespaces as written.
    document = etree.fromstring(etree.tostring(element))
    if not schema.validate(document):
        raise AssertionError(
            f"{etree.QName(element).text} is invalid:\n{schema.error_log}\n"
            f"{etree.tostring(element, pretty_print=True).decode()}")
