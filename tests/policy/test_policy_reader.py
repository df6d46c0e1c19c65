"""Reading the WS-RM assertion out of a WSDL: the WS-Policy and WS-RM Policy versions peers publish."""

from __future__ import annotations

import logging

import pytest
from lxml import etree

from interceptors.policy_reader import PolicyError, PublishedRMPolicy, read_rm_policy
from interceptors.wsdl import RMPolicyAssertion, attach_policy
from wsrm_plugin import DeliveryAssurance, RMPolicy
from wsrm_plugin.wire import RM10, RM11

WSP04 = "http://schemas.xmlsoap.org/ws/2004/09/policy"
WSP15 = "http://www.w3.org/ns/ws-policy"
WSU = "http://docs.oasis-open.org/wss/2004/01/oasis-200401-wss-wssecurity-utility-1.0.xsd"
RMP10 = "http://schemas.xmlsoap.org/ws/2005/02/rm/policy"
RMP11 = "http://docs.oasis-open.org/ws-rx/wsrmp/200702"
EO, ALO, AMO, IO = (DeliveryAssurance.EXACTLY_ONCE, DeliveryAssurance.AT_LEAST_ONCE,
                    DeliveryAssurance.AT_MOST_ONCE, DeliveryAssurance.IN_ORDER)


def wsdl(binding_extra: str = "", top: str = "", port_extra: str = "", other_binding_extra: str = "") -> etree._Element:
    text = f"""<wsdl:definitions xmlns:wsdl="http://schemas.xmlsoap.org/wsdl/"
        xmlns:tns="urn:t" targetNamespace="urn:t" xmlns:wsp="{WSP15}" xmlns:wsp04="{WSP04}"
        xmlns:wsu="{WSU}" xmlns:rmp10="{RMP10}" xmlns:rmp11="{RMP11}"
        xmlns:netrmp="http://schemas.microsoft.com/ws-rx/wsrmp/200702">
      {top}
      <wsdl:binding name="B" type="tns:P">{binding_extra}</wsdl:binding>
      <wsdl:binding name="Other" type="tns:P">{other_binding_extra}</wsdl:binding>
      <wsdl:service name="S"><wsdl:port name="Port" binding="tns:B">{port_extra}</wsdl:port></wsdl:service>
    </wsdl:definitions>"""
    return etree.fromstring(text)


B = etree.QName("urn:t", "B")

RM10_POLICY = """<wsp04:Policy wsu:Id="rm10"><rmp10:RMAssertion>
    <rmp10:InactivityTimeout Milliseconds="600000"/><rmp10:BaseRetransmissionInterval Milliseconds="3000"/>
    <rmp10:ExponentialBackoff/><rmp10:AcknowledgementInterval Milliseconds="200"/>
  </rmp10:RMAssertion></wsp04:Policy>"""


def test_ws_rm_policy_1_0_under_ws_policy_2004_09_gives_the_version_and_timers():
    found = read_rm_policy(wsdl('<wsp04:PolicyReference URI="#rm10"/>', top=RM10_POLICY), B)
    assert found == PublishedRMPolicy(RM10, inactivity_timeout=600.0, base_retransmission_interval=3.0,
                                      exponential_backoff=True, acknowledgement_interval=0.2)


@pytest.mark.parametrize("assurance,in_order,expected", [
    ("ExactlyOnce", True, (EO, True)), ("AtLeastOnce", False, (ALO, False)), ("AtMostOnce", True, (AMO, True)),
])
def test_ws_rm_policy_1_1_and_1_2_under_ws_policy_1_5_give_the_delivery_assurance(assurance, in_order, expected):
    inner = f"<rmp11:{assurance}/>" + ("<rmp11:InOrder/>" if in_order else "")
    policy = f"""<wsp:Policy wsu:Id="rm11"><wsp:ExactlyOne><wsp:All><rmp11:RMAssertion><wsp:Policy>
        <rmp11:DeliveryAssurance><wsp:Policy>{inner}</wsp:Policy></rmp11:DeliveryAssurance>
        </wsp:Policy></rmp11:RMAssertion></wsp:All></wsp:ExactlyOne></wsp:Policy>"""
    found = read_rm_policy(wsdl('<wsp:PolicyReference URI="#rm11"/>', top=policy), B)
    assert (found.rm_version, found.delivery, found.in_order) == (RM11, *expected)


def test_what_this_project_publishes_is_read_back():
    for published, version in ((RMPolicyAssertion(version=RM10, inactivity_timeout_ms=5000), RM10),
                               (RMPolicyAssertion(delivery_assurance="AtLeastOnce", in_order=True), RM11)):
        definitions = wsdl()
        attach_policy(definitions, published)
        found = read_rm_policy(definitions, B)
        assert found.rm_version is version
    assert found.delivery == ALO and found.in_order is True


def test_an_inline_policy_a_policy_uris_attribute_and_a_port_attachment_count():
    inline = wsdl(RM10_POLICY.replace('wsu:Id="rm10"', ""))
    assert read_rm_policy(inline, B).rm_version is RM10
    by_uris = wsdl(top=RM10_POLICY)
    by_uris.find("{http://schemas.xmlsoap.org/wsdl/}binding").set(f"{{{WSP04}}}PolicyURIs", "#rm10")
    assert read_rm_policy(by_uris, B).rm_version is RM10
    on_port = wsdl(top=RM10_POLICY, port_extra='<wsp04:PolicyReference URI="#rm10"/>')
    assert read_rm_policy(on_port, B).rm_version is RM10


def test_a_nested_reference_is_followed_and_wcf_timers_beside_a_1_1_assertion_are_read():
    top = """<wsp:Policy wsu:Id="outer"><wsp:ExactlyOne><wsp:All><wsp:PolicyReference URI="#inner"/>
        <netrmp:InactivityTimeout Milliseconds="30000"/></wsp:All></wsp:ExactlyOne></wsp:Policy>
        <wsp:Policy wsu:Id="inner"><rmp11:RMAssertion><wsp:Policy/></rmp11:RMAssertion></wsp:Policy>"""
    found = read_rm_policy(wsdl('<wsp:PolicyReference URI="#outer"/>', top=top), B)
    assert (found.rm_version, found.inactivity_timeout) == (RM11, 30.0)


def test_no_assertion_or_another_bindings_assertion_is_none():
    assert read_rm_policy(wsdl(), B) is None
    assert read_rm_policy(wsdl(top=RM10_POLICY, other_binding_extra='<wsp04:PolicyReference URI="#rm10"/>'),
                          B) is None


def test_an_unresolvable_reference_is_logged_and_ignored(caplog):
    with caplog.at_level(logging.WARNING, logger="interceptors.policy_reader"):
        assert read_rm_policy(wsdl('<wsp:PolicyReference URI="http://elsewhere/p#x"/>'), B) is None
    assert "not in this WSDL document" in caplog.text


def test_a_cyclic_reference_terminates():
    top = """<wsp:Policy wsu:Id="a"><wsp:PolicyReference URI="#b"/></wsp:Policy>
             <wsp:Policy wsu:Id="b"><wsp:PolicyReference URI="#a"/></wsp:Policy>"""
    assert read_rm_policy(wsdl('<wsp:PolicyReference URI="#a"/>', top=top), B) is None


@pytest.mark.parametrize("value", ["soon", "-5", ""])
def test_a_malformed_timer_is_a_clear_error(value):
    top = RM10_POLICY.replace('Milliseconds="3000"', f'Milliseconds="{value}"')
    with pytest.raises(PolicyError, match="BaseRetransmissionInterval Milliseconds="):
        read_rm_policy(wsdl('<wsp04:PolicyReference URI="#rm10"/>', top=top), B)


def test_apply_keeps_what_the_user_set_and_takes_the_rest():
    published = PublishedRMPolicy(RM10, delivery=ALO, in_order=False, inactivity_timeout=100.0,
                                  base_retransmission_interval=90.0, acknowledgement_interval=0.5)
    merged = published.apply(RMPolicy(acknowledgement_interval=0.0))
    assert merged.rm_version is RM10 and merged.delivery == ALO
    assert merged.inactivity_timeout == 100.0 and merged.acknowledgement_interval == 0.0
    assert merged.base_retransmission_interval == 90.0
    assert merged.max_retransmission_interval == 90.0      # raised to stay >= base
    assert merged.explicit_fields == {"acknowledgement_interval"}
    with pytest.raises(PolicyError, match="exceeds the max_retransmission_interval you set"):
        published.apply(RMPolicy(max_retransmission_interval=60.0))
    assert PublishedRMPolicy(RM11).apply(RMPolicy()) == RMPolicy()


def test_explicit_fields_follow_the_constructor_and_replace():
    policy = RMPolicy(rm_version="1.0")
    assert policy.explicit_fields == {"rm_version"}
    assert policy.replace(max_retries=2).explicit_fields == {"rm_version", "max_retries"}
    assert RMPolicy().explicit_fields == frozenset()
    assert RMPolicy(ALO, 1.0).explicit_fields == {"delivery", "base_retransmission_interval"}  # positional
    assert RMPolicy(rm_version="1.1") == RMPolicy()         # equality ignores who chose
