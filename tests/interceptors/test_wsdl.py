"""The published WSDL: spyne's one-way defect fixed, the WS-RM policy attached and readable."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import zeep
from lxml import etree
from spyne.server.wsgi import WsgiApplication

from interceptors import Interceptor, InterceptorChain, Phase
from interceptors.spyne_server.adapter import engage
from interceptors.wsdl import (
    WSAM_NS, WSDL_NS, WSP_12_NS, WSP_15_NS, WSRMP_10_NS, WSRMP_11_NS, WSU_NS, RMPolicyAssertion,
)
from wsrm_plugin.wire.namespaces import RM10
from wsrm_plugin.wire.xmlsafe import parse_xml

from .conftest import Service, serve

SCHEMAS = Path(__file__).parent / "schemas"
SOAP_WSDL = "http://schemas.xmlsoap.org/wsdl/soap/"


class ReliableStandIn(Interceptor):
    """Stands for the WS-RM interceptor: only its phase matters to the WSDL."""

    name = "wsrm"
    phase = Phase.RELIABLE_MESSAGING

    def handle_in(self, message):
        pass


def fetch_wsdl(app) -> tuple[etree._Element, zeep.Client]:
    with serve(app) as url:
        text = requests.get(url + "?wsdl", timeout=30).content
        client = zeep.Client(url + "?wsdl")
    return parse_xml(text), client


def validate(element: etree._Element, schema: str) -> None:
    etree.XMLSchema(etree.parse(str(SCHEMAS / schema))).assertValid(
        etree.fromstring(etree.tostring(element)))


def test_zeep_refuses_spyne_one_way_wsdl_as_spyne_publishes_it(service: Service):
    with serve(WsgiApplication(service.application)) as url:
        with pytest.raises(Exception, match="ReplyToHeader"):
            zeep.Client(url + "?wsdl")


def test_engaged_one_way_wsdl_loads_in_zeep(service: Service):
    definitions, client = fetch_wsdl(engage(service.application, InterceptorChain()))
    assert "notify" in dir(client.service)
    # Only the dangling references went; the definitions have no such messages to point at.
    headers = definitions.findall(f".//{{{SOAP_WSDL}}}header")
    assert headers == []
    assert {m.get("name") for m in definitions.findall(f"{{{WSDL_NS}}}message")} >= {"notify", "echo"}


def policies(definitions: etree._Element, wsp: str) -> list[etree._Element]:
    return definitions.findall(f"{{{wsp}}}Policy")


def test_rm11_policy_is_published_and_referenced_from_the_binding(service: Service):
    policy = RMPolicyAssertion(delivery_assurance="ExactlyOnce", in_order=True)
    definitions, client = fetch_wsdl(engage(service.application, InterceptorChain(),
                                            rm_policy=policy))
    assert client.service.echo  # zeep still reads it
    [found] = policies(definitions, WSP_15_NS)
    assert found.get(f"{{{WSU_NS}}}Id") == "WSRMPolicy"
    [assertion] = found.findall(f"{{{WSRMP_11_NS}}}RMAssertion")
    validate(assertion, "wsrm-policy-200702.xsd")
    assurance = assertion.find(f"{{{WSP_15_NS}}}Policy/{{{WSRMP_11_NS}}}DeliveryAssurance/{{{WSP_15_NS}}}Policy")
    assert [etree.QName(e).localname for e in assurance] == ["ExactlyOnce", "InOrder"]
    addressing = found.find(f"{{{WSAM_NS}}}Addressing")
    assert addressing is not None and addressing.find(f"{{{WSP_15_NS}}}Policy") is not None
    for binding in definitions.findall(f"{{{WSDL_NS}}}binding"):
        [reference] = binding.findall(f"{{{WSP_15_NS}}}PolicyReference")
        assert reference.get("URI") == "#WSRMPolicy"


def test_rm10_policy_uses_the_2005_02_assertion_and_ws_policy_2004_09(service: Service):
    policy = RMPolicyAssertion(RM10, inactivity_timeout_ms=600000,
                               base_retransmission_interval_ms=3000, exponential_backoff=True,
                               acknowledgement_interval_ms=200)
    definitions, client = fetch_wsdl(engage(service.application, InterceptorChain(),
                                            rm_policy=policy))
    assert client.service.echo
    [found] = policies(definitions, WSP_12_NS)
    [assertion] = found.findall(f"{{{WSRMP_10_NS}}}RMAssertion")
    validate(assertion, "wsrm-policy-200502.xsd")
    assert [(etree.QName(e).localname, e.get("Milliseconds")) for e in assertion] == [
        ("InactivityTimeout", "600000"), ("BaseRetransmissionInterval", "3000"),
        ("ExponentialBackoff", None), ("AcknowledgementInterval", "200")]
    [binding] = definitions.findall(f"{{{WSDL_NS}}}binding")
    assert binding.find(f"{{{WSP_12_NS}}}PolicyReference").get("URI") == "#WSRMPolicy"


@pytest.mark.parametrize("rm_policy, chain_has_rm, published", [
    (False, True, False),
    (True, False, True),
    (None, False, False),
    (None, True, True),
])
def test_policy_switch(rm_policy, chain_has_rm, published, service: Service):
    chain = InterceptorChain([ReliableStandIn()] if chain_has_rm else [])
    definitions, _ = fetch_wsdl(engage(service.application, chain, rm_policy=rm_policy))
    assert bool(policies(definitions, WSP_15_NS)) is published
    assert bool(definitions.findall(f".//{{{WSP_15_NS}}}PolicyReference")) is published


def test_policy_options_a_version_cannot_express_are_refused():
    with pytest.raises(ValueError, match="1.1 has no inactivity_timeout_ms"):
        RMPolicyAssertion(inactivity_timeout_ms=1000)
    with pytest.raises(ValueError, match="1.0 has no delivery assurance"):
        RMPolicyAssertion("1.0", delivery_assurance="AtLeastOnce")
    with pytest.raises(ValueError, match="delivery_assurance must be one of"):
        RMPolicyAssertion(delivery_assurance="Sometimes")
    with pytest.raises(ValueError, match="unknown WS-RM version"):
        RMPolicyAssertion("2.0")


def test_engage_refuses_a_wsdl_already_built(service: Service):
    wsgi = WsgiApplication(service.application)
    with serve(wsgi) as url:
        requests.get(url + "?wsdl", timeout=30)
    with pytest.raises(ValueError, match="already built"):
        engage(service.application, InterceptorChain(), wsgi_application=wsgi)
