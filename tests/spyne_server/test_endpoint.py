"""What the endpoint says by itself: its WSDL, and its refusal of unreliable calls."""

from __future__ import annotations

import urllib.request

import pytest
import zeep
from lxml import etree

from wsrm_plugin.wire import parse_envelope

from . import service
from .conftest import Envelopes, fast_policy

WSRMP_11 = "http://docs.oasis-open.org/ws-rx/wsrmp/200702"
WSRMP_10 = "http://schemas.xmlsoap.org/ws/2005/02/rm/policy"


def _post(url: str, body: bytes, soap_action: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "text/xml; charset=utf-8", "SOAPAction": f'"{soap_action}"'})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.parametrize(("rm_version", "namespace"), [("1.1", WSRMP_11), ("1.0", WSRMP_10)])
def test_the_wsdl_loads_in_zeep_and_carries_the_rm_policy(servers, rm_version, namespace):
    server = servers("memory:", fast_policy(rm_version=rm_version))
    client = zeep.Client(server.url + "?wsdl")  # the one-way defect is fixed, or zeep refuses it
    assert {"record", "echo"} <= set(client.service._binding._operations)

    with urllib.request.urlopen(server.url + "?wsdl", timeout=10) as response:
        wsdl = etree.fromstring(response.read())
    assertions = wsdl.findall(f".//{{{namespace}}}RMAssertion")
    assert len(assertions) == 1
    if rm_version == "1.1":
        assert wsdl.find(f".//{{{namespace}}}ExactlyOnce") is not None
        assert wsdl.find(f".//{{{namespace}}}InOrder") is not None


def test_a_call_outside_a_sequence_is_refused_with_wsrm_required(servers):
    server = servers("memory:", fast_policy(rm_version="1.1"))
    status, body = _post(server.url, Envelopes(server.url)("record", "loose"), f"{service.TNS}/record")
    assert status == 500
    fault = parse_envelope(body).fault()
    assert b"WSRMRequired" in body, body
    assert "requires WS-ReliableMessaging" in fault.reason
    assert server.engine.status().buffered == 0 and service.recorded() == []


def test_rm_1_0_refuses_with_a_sender_fault(servers):
    server = servers("memory:", fast_policy(rm_version="1.0"))
    status, body = _post(server.url, Envelopes(server.url)("record", "loose"), f"{service.TNS}/record")
    assert status == 500
    fault = parse_envelope(body).fault()
    assert fault.code == "Sender" and "WS-ReliableMessaging 1.0" in fault.reason
    assert service.recorded() == []


def test_an_rm_optional_service_runs_a_plain_call_at_once(servers):
    server = servers("memory:", fast_policy(), required=False)
    client = zeep.Client(server.url + "?wsdl")
    assert client.service.echo("plain") == "re:plain"
    assert service.recorded() == ["plain"]
    assert server.engine.status().rmd_sequences == 0
