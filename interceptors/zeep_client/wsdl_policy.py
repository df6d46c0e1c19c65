"""WS-Policy-driven engagement: a reliable zeep client takes the service's WS-RM policy from its WSDL.

CXF and WCF clients configure WS-RM from the ``RMAssertion`` the service
publishes; so does :func:`~interceptors.zeep_client.client.reliable_client`
(``wsdl_policy=True``, the default): a service that publishes WS-RM 1.0 is
spoken to in 1.0 without any option, and the delivery assurance and timers
it states are used.  What the user's :class:`~wsrm_plugin.engine.policy.RMPolicy`
sets explicitly wins (:attr:`~wsrm_plugin.engine.policy.RMPolicy.explicit_fields`);
a WSDL without the assertion changes nothing.

zeep keeps no raw XML of the WSDL it parsed, so the documents are read again
through the client's own transport (its session, its cache when it has one).
"""

from __future__ import annotations

import logging
from typing import Any

from lxml import etree

from wsrm_plugin.engine.policy import RMPolicy
from wsrm_plugin.wire.xmlsafe import parse_xml

from interceptors.policy_reader import PublishedRMPolicy, read_rm_policy

__all__ = ["published_policy", "policy_from_wsdl"]

log = logging.getLogger(__name__)


def _documents(client: Any) -> list[etree._Element]:
    locations: list[str] = []
    for definition in getattr(client.wsdl, "_definitions", {}).values():
        location = getattr(definition, "location", None)
        if location and location not in locations:
            locations.append(location)
    if not locations and getattr(client.wsdl, "location", None):
        locations.append(client.wsdl.location)
    documents = []
    for location in locations:
        try:
            data = client.transport.load(location)
        except Exception as exc:  # noqa: BLE001 -- re-raised with what was being done
            raise RuntimeError(f"could not read the WSDL {location} again for its WS-RM policy: {exc} "
                               "(pass wsdl_policy=False to configure WS-RM from RMPolicy alone)") from exc
        root = parse_xml(data)
        if etree.QName(root).localname == "definitions":
            documents.append(root)
    return documents


def published_policy(client: Any) -> PublishedRMPolicy | None:
    """The WS-RM assertion the WSDL attaches to the binding ``client.service`` uses, or None."""
    binding = getattr(getattr(client.service, "_binding", None), "name", None)
    return read_rm_policy(_documents(client), binding)


def policy_from_wsdl(client: Any, policy: RMPolicy | None) -> RMPolicy:
    """``policy`` (default ``RMPolicy()``) completed with what the service's WSDL publishes."""
    policy = policy if policy is not None else RMPolicy()
    published = published_policy(client)
    if published is None:
        log.debug("the WSDL of %s publishes no WS-RM policy assertion", getattr(client.wsdl, "location", "?"))
        return policy
    return published.apply(policy)
