"""The PostgreSQL store's pool keeps the sessions its load needs at once.

A pool that kept only ``pool_size`` sessions idle closed, under a load needing a few more at once,
a session given back while another thread opened a new one: each a backend started and its
statements prepared again (the client's store at 16 XA sequences: 23 sessions closed and 42
opened in 3,200 messages).  Counted here by the backends' process ids."""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest

from txmanager import TransactionManager
from wsrm_plugin.store import StorageManager
from wsrm_plugin.store import postgres as pg_store

from .conftest import KINDS

pytestmark = pytest.mark.parametrize("store_url", [KINDS[2]], indirect=True)


def _burst(store: StorageManager, at_once: int) -> set[int]:
    """``at_once`` transactions open together, each on a session of its own; their backends."""
    txs = [store.begin() for _ in range(at_once)]
    pids = {tx.conn.info.backend_pid for tx in txs}
    for tx in txs:
        tx.commit()
    return pids


def test_a_load_above_pool_size_reuses_its_sessions(open_kind: Any) -> None:
    store = open_kind(pool_size=2)
    first = _burst(store, 5)
    assert len(first) == 5
    # the same five again, and again: no backend started, none closed (before: 3 new each time)
    assert _burst(store, 5) == first
    assert _burst(store, 5) == first
    assert _burst(store, 1) <= first


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_sessions_beyond_pool_size_close_once_the_load_is_gone(open_kind: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(pg_store, "time", clock)
    store = open_kind(pool_size=2)
    first = _burst(store, 5)
    assert _burst(store, 5) == first  # within the window: all kept
    # one session at a time for two windows: the peak of five is forgotten
    for _ in range(2):
        clock.now += pg_store._PEAK_WINDOW
        _burst(store, 1)
    for _ in range(5):
        _burst(store, 1)
    assert len(store._idle) == 2  # type: ignore[attr-defined]  # pool_size again
    # what is idle serves the next burst, the rest are new backends
    assert len(_burst(store, 5) & first) == 2


def test_a_branch_whose_session_cannot_connect_is_not_counted_out(open_kind: Any, tmp_path: Any) -> None:
    store = open_kind(pool_size=2)
    tm = TransactionManager(node="pooltest", log=tmp_path / "tm.log", default_timeout=60)

    def refused() -> Any:
        raise psycopg2.OperationalError("connection refused (on purpose)")

    try:
        store._connect = refused  # type: ignore[method-assign]
        for _ in range(3):
            with pytest.raises(psycopg2.OperationalError), tm.transaction():
                store.begin(xa=tm)
        # else each failed connect stayed counted out, and the pool kept more idle for it
        assert store._out == 0  # type: ignore[attr-defined]
    finally:
        tm.close()
