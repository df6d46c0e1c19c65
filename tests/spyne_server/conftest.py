"""Fixtures: a reliable spyne service on loopback and a reliable engine client talking to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zeep
from lxml import etree

from interceptors.spyne_server.service import ReliableService, reliable_service
from wsrm_plugin.engine import ReliableEngine, RMPolicy

from tests.engine.support import wait_for

from . import service

#: Short intervals so retransmissions happen within seconds; waits are generous, only against hangs.
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05,
            http_timeout=5.0, soap_version="1.1")


def fast_policy(**overrides: Any) -> RMPolicy:
    return RMPolicy(**{**FAST, **overrides})


@pytest.fixture(autouse=True)
def _fresh_service_state() -> Iterator[None]:
    service.reset()
    yield
    service.reset()


@pytest.fixture
def servers() -> Iterator[Callable[..., ReliableService]]:
    """``make(store, policy=None, **options)``: a served and started ReliableService, stopped after."""
    made: list[ReliableService] = []

    def make(store: Any = "memory:", policy: RMPolicy | None = None, **options: Any) -> ReliableService:
        server = reliable_service(service.application(), store, policy or fast_policy(), **options)
        made.append(server)
        server.serve()
        return server.start()

    yield make
    for server in reversed(made):
        server.stop(timeout=5)


@pytest.fixture
def app_pg() -> Iterator[Any]:
    """The application's own PostgreSQL server (not the store's), which a test stops and starts."""
    from tests.conftest import start_throwaway_server

    server = start_throwaway_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def clients() -> Iterator[Callable[..., ReliableEngine]]:
    """``make(store="memory:", policy=None, **kwargs)``: a served, started engine (the RM source)."""
    made: list[ReliableEngine] = []

    def make(store: Any = "memory:", policy: RMPolicy | None = None, **kwargs: Any) -> ReliableEngine:
        engine = ReliableEngine(store, policy or fast_policy(), name="client", **kwargs)
        made.append(engine)
        engine.serve()
        return engine.start()

    yield make
    for engine in reversed(made):
        engine.stop(timeout=5)


class Envelopes:
    """Request envelopes for the service, built by zeep from the service's own WSDL."""

    def __init__(self, url: str) -> None:
        self.client = zeep.Client(url + "?wsdl")

    def __call__(self, operation: str, value: str) -> bytes:
        envelope = self.client.create_message(self.client.service, operation, value)
        return etree.tostring(envelope, xml_declaration=True, encoding="utf-8")


def action(operation: str) -> str:
    return f"{service.TNS}/{operation}"


def send_records(servers: Callable[..., ReliableService], clients: Callable[..., ReliableEngine],
                 items: list[str], **options: Any) -> list[str]:
    """Sends ``record`` one-way calls over memory stores and returns what the service recorded
    once every item arrived."""
    policy = fast_policy()
    server = servers("memory:", policy, **options)
    client = clients("memory:", policy)
    build = Envelopes(server.url)
    for item in items:
        client.send(server.url, build("record", item), action=action("record"))
    assert wait_for(lambda: len(service.recorded()) >= len(items)), service.recorded()
    return service.recorded()
