"""Fixtures: a reliable spyne service on loopback and zeep clients without a listener."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zeep

from interceptors.spyne_server.service import ReliableService, reliable_service
from wsrm_plugin.engine import RMPolicy
from interceptors.zeep_client.client import ReliableClient, reliable_client

from . import service

#: Short intervals so retransmissions happen within seconds; waits are generous only against hangs.
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05,
            http_timeout=10.0, soap_version="1.1")


def fast_policy(**overrides: Any) -> RMPolicy:
    return RMPolicy(**{**FAST, **overrides})


@pytest.fixture(autouse=True)
def _fresh_service() -> Iterator[None]:
    service.reset()
    yield
    service.reset()


@pytest.fixture
def servers() -> Iterator[Callable[..., ReliableService]]:
    """``make(policy=None, **options)``: a served, started ReliableService of the echo service."""
    made: list[ReliableService] = []

    def make(policy: RMPolicy | None = None, store: Any = "memory:", **options: Any) -> ReliableService:
        server = reliable_service(service.application(), store, policy or fast_policy(), **options)
        made.append(server)
        server.serve()
        return server.start()

    yield make
    for server in reversed(made):
        server.stop(timeout=5)


@pytest.fixture
def clients() -> Iterator[Callable[..., ReliableClient]]:
    """``make(wsdl_url, address=None, **options)``: a reliable zeep client with no listener.

    ``address`` sends the calls somewhere else than the WSDL says (a proxy).
    """
    made: list[ReliableClient] = []

    def make(wsdl_url: str, address: str | None = None, policy: RMPolicy | None = None,
             **options: Any) -> ReliableClient:
        zc = zeep.Client(wsdl_url + "?wsdl")
        if address is not None:
            zc.service._binding_options["address"] = address
        rc = reliable_client(zc, "memory:", policy or fast_policy(), name=f"anon-{len(made)}", **options)
        made.append(rc)
        return rc

    yield make
    for rc in reversed(made):
        rc.stop(timeout=5, discard_unsent=True)  # a test that needs everything sent flushes
