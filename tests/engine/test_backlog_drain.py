"""Draining a backlog costs each message as much at any backlog (issue 33): the whole send path.

``tests/store/test_backlog.py`` counts the rows two store calls touch (a send batch, an
acknowledgement).  Draining a backlog runs more than those: the sender's rounds (the claim,
the send attempts recorded, the payloads read), the acknowledgements applied and purged, the
acknowledgement and control work of each round.  Here a client engine on a SQLite store, with
a backlog queued while its peer was away, drains its first messages to a real service over
loopback HTTP, and the client store's work a message delivered is counted: SQLite's virtual
machine steps (its progress handler: a proxy for the rows touched) and its statements.  At 20
times the backlog a cost that grew with it would be many times as high; flat, it is about the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from wsrm_plugin.engine import ReliableEngine
from wsrm_plugin.engine.envelopes import prepare_outgoing

from .conftest import fast_policy
from .support import ACTION, Recorder, payload, wait_for

SMALL, LARGE = 200, 4000
#: Messages drained and counted at each backlog
COUNTED = 150
#: SQLite's progress handler runs every this many virtual machine steps
STEPS = 50


class _StoreWork:
    """SQLite's virtual machine steps and statements on a store's connections (traced from outside)."""

    def __init__(self, store: Any) -> None:
        self.steps = 0
        self.statements = 0
        self.counting = False
        self._lock = threading.Lock()
        connect = store._connect

        def counted_connect() -> Any:
            conn = connect()
            self._trace(conn)
            return conn
        store._connect = counted_connect
        for conn in list(store._idle):
            self._trace(conn)

    def _trace(self, conn: Any) -> None:
        def step() -> int:
            if self.counting:
                with self._lock:
                    self.steps += STEPS
            return 0

        def statement(sql: str) -> None:
            if self.counting:
                with self._lock:
                    self.statements += 1
        conn.set_progress_handler(step, STEPS)
        conn.set_trace_callback(statement)


def _drain(tmp_path: Path, engines: Callable[..., ReliableEngine], queued: int,
           **policy: Any) -> tuple[float, float]:
    """Steps and statements of the client's store a message, over its first COUNTED deliveries
    of a backlog of ``queued`` messages."""
    recorder = Recorder()
    server = engines("memory:", fast_policy(), serve=True, application=recorder)
    client = ReliableEngine(f"sqlite:///{tmp_path}/client-{queued}.db", fast_policy(**policy), name="client")
    try:
        target = server.endpoint_address
        addressing = client.policy.addressing
        with client.store.begin() as tx:  # the backlog, queued while the peer was away
            for i in range(queued):
                outgoing = prepare_outgoing(payload(f"m{i}"), to=target, action=ACTION, message_id=None,
                                            reply_to=None, relates_to=None, wsa=addressing,
                                            max_size=client.policy.max_message_size)
                client.source._enqueue_outgoing(tx, (target, "backlog", False), outgoing)
        work = _StoreWork(client.store)
        work.counting = True
        client.start()
        assert wait_for(lambda: len(recorder.snapshot()) >= COUNTED, timeout=60)
        work.counting = False
        delivered = len(recorder.snapshot())
        return work.steps / delivered, work.statements / delivered
    finally:
        client.stop(timeout=5)


@pytest.mark.parametrize("policy", [{}, {"max_unacknowledged": 16}], ids=["default", "window"])
def test_draining_a_backlog_touches_as_many_rows_a_message_at_any_backlog(tmp_path, engines, policy) -> None:
    small = _drain(tmp_path, engines, SMALL, **policy)
    large = _drain(tmp_path, engines, LARGE, **policy)
    for what, at_small, at_large in zip(("virtual machine steps", "statements"), small, large, strict=True):
        # 20 times the backlog: a cost that grew with it would be several times as high
        assert at_large <= 1.5 * at_small + 20, (
            f"draining a backlog: {at_small:.0f} {what} a message at {SMALL} queued, {at_large:.0f} at {LARGE}")
