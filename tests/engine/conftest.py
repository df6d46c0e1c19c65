"""Fixtures for the engine tests: engines on real loopback HTTP, stopped at teardown."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from wsrm_plugin.engine import ReliableEngine, RMPolicy

#: Short intervals so retransmissions happen within a test's seconds; the timeouts
#: tests wait with are generous and only there to turn a hang into a failure.
FAST = dict(base_retransmission_interval=0.2, exponential_backoff=False, poll_interval=0.05,
            http_timeout=5.0)


def fast_policy(**overrides: Any) -> RMPolicy:
    return RMPolicy(**{**FAST, **overrides})


@pytest.fixture
def store_for(tmp_path: Path) -> Callable[[str, str], str]:
    """``store_for(kind, name) -> url``: ``memory:`` or an SQLite file in the test's tmp dir."""

    def make(kind: str, name: str) -> str:
        if kind == "memory":
            return "memory:"
        if kind == "sqlite":
            return f"sqlite:///{tmp_path}/{name}.db"
        raise ValueError(kind)

    return make


@pytest.fixture
def engines() -> Iterator[Callable[..., ReliableEngine]]:
    """``make(store_url, policy=None, serve=False, **kwargs)``: a started engine, stopped afterwards."""
    made: list[ReliableEngine] = []

    def make(store: Any, policy: RMPolicy | None = None, *, serve: bool = False,
             middleware: Any = None, **kwargs: Any) -> ReliableEngine:
        engine = ReliableEngine(store, policy or fast_policy(), **kwargs)
        made.append(engine)
        if serve:
            engine.serve(middleware=middleware)
        return engine.start()

    yield make
    for engine in reversed(made):
        engine.stop(timeout=5)
