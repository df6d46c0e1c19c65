"""Fixtures: a reliable spyne service of the conformance service on loopback, and hand-writing peers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from interceptors.spyne_server.service import ReliableService, reliable_service
from wsrm_plugin.engine import RMPolicy

from . import service
from .peer import RawPeer

#: Short intervals so retransmissions happen within seconds; waits are generous only against hangs.
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05, http_timeout=10.0)


def fast_policy(**overrides: Any) -> RMPolicy:
    return RMPolicy(**{**FAST, **overrides})


@pytest.fixture(autouse=True)
def _fresh_service() -> Iterator[None]:
    service.reset()
    yield
    service.reset()


@pytest.fixture
def servers() -> Iterator[Callable[..., ReliableService]]:
    """``make(policy=None, soap="1.2", store="memory:", **options)``: a served, started ReliableService."""
    made: list[ReliableService] = []

    def make(policy: RMPolicy | None = None, *, soap: str = "1.2", store: Any = "memory:",
             **options: Any) -> ReliableService:
        server = reliable_service(service.application(soap), store, policy or fast_policy(), **options)
        made.append(server)
        server.serve()
        return server.start()

    yield make
    for server in reversed(made):
        server.stop(timeout=5)


@pytest.fixture
def server(servers) -> ReliableService:
    return servers()


@pytest.fixture
def peer(server) -> RawPeer:
    return RawPeer(server.url)
