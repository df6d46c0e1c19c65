"""How a sending round spreads its messages over ``send_concurrency`` connections.

The destination records a sequence's messages one at a time (its
acknowledgement state is one row, locked until the receive is durable), so
requests on *different* sequences are what can overlap there.  A round with
several independent sequences gives each its own lane and sends them at once;
a round with one sequence pipelines it over several lanes; sequences that
continue one another (rolled over) keep their order, the older first.  The
server here is a real engine behind a WSGI middleware that watches what is
in flight.
"""

from __future__ import annotations

import io
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from wsrm_plugin.engine import ReliableEngine

from .conftest import fast_policy
from .support import ACTION, Recorder, item_text, payload, wait_for

_IDENTIFIER = re.compile(rb"<(?:\w+:)?Identifier>([^<]+)</")
_APPLICATION_MESSAGE = re.compile(rb"<(\w+:)?Sequence[\s>]")


class InFlight:
    """WSGI middleware: each application message takes ``delay`` seconds; records what overlapped."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.arrivals: list[tuple[str, str | None]] = []  # (sequence id, item text), as they came
        self.most_sequences = 0  # distinct sequences with a request in flight at one moment
        self.most_per_sequence = 0  # requests of one sequence in flight at one moment
        self._now: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            found = _IDENTIFIER.search(body)
            if not _APPLICATION_MESSAGE.search(body) or found is None:
                return app(environ, start_response)
            sid = found.group(1).decode()
            with self._lock:
                self.arrivals.append((sid, item_text(body)))
                self._now[sid] += 1
                self.most_sequences = max(self.most_sequences, sum(1 for n in self._now.values() if n))
                self.most_per_sequence = max(self.most_per_sequence, self._now[sid])
            try:
                time.sleep(self.delay)
                return list(app(environ, start_response))
            finally:
                with self._lock:
                    self._now[sid] -= 1

        return middleware


def _client_with_backlog(server: ReliableEngine, policy, messages: dict[str, int]) -> ReliableEngine:
    """A client whose messages are all enqueued before it starts, so one round claims them together."""
    client = ReliableEngine("memory:", policy, name="client")
    for key, count in messages.items():
        for i in range(count):
            client.send(server.endpoint_address, payload(f"{key}{i}"), action=ACTION, key=key)
    return client.start()


def _by_key(texts: list[str | None]) -> dict[str, list[str]]:
    """Items grouped by their key (the first letter), in the order given."""
    out: dict[str, list[str]] = {}
    for text in texts:
        assert text is not None
        out.setdefault(text[0], []).append(text)
    return out


def test_independent_sequences_go_out_at_once_each_on_its_own_lane(engines):
    watch = InFlight(delay=0.15)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    policy = fast_policy(send_concurrency=4, base_retransmission_interval=5.0)
    client = _client_with_backlog(server, policy, {"a": 3, "b": 3, "c": 3, "d": 3})
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 12), \
            client.status()
    finally:
        client.stop(timeout=5)
    assert watch.most_sequences >= 2  # one sequence after the other would never overlap
    assert watch.most_per_sequence == 1  # each sequence in order on its lane
    assert _by_key(received.snapshot()) == {key: [f"{key}{i}" for i in range(3)] for key in "abcd"}


def test_one_sequence_alone_is_pipelined_over_several_lanes(engines):
    watch = InFlight(delay=0.15)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    policy = fast_policy(send_concurrency=4, base_retransmission_interval=5.0)
    client = _client_with_backlog(server, policy, {"a": 8})
    try:
        assert wait_for(lambda: len(received.snapshot()) == 8), client.status()
    finally:
        client.stop(timeout=5)
    assert watch.most_per_sequence >= 2
    assert received.snapshot() == [f"a{i}" for i in range(8)]  # the destination orders them


def test_rolled_over_sequences_keep_their_order_while_other_keys_go_alongside(engines):
    watch = InFlight(delay=0.05)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    policy = fast_policy(send_concurrency=4, max_sequence_length=3, base_retransmission_interval=5.0)
    client = _client_with_backlog(server, policy, {"a": 7, "b": 7})
    try:
        assert wait_for(lambda: len(received.snapshot()) == 14), client.status()
    finally:
        client.stop(timeout=5)
    arrived = _by_key([text for _, text in watch.arrivals])
    for key in "ab":
        assert arrived[key] == [f"{key}{i}" for i in range(7)]  # generation 1, then 2, then 3
        assert [t for t in received.snapshot() if t[0] == key] == [f"{key}{i}" for i in range(7)]
    assert len({sid for sid, _ in watch.arrivals}) == 6  # three sequences per key


def test_a_pipelined_rounds_acknowledgements_are_applied_once_not_once_per_lane(engines):
    """Each answer acknowledges what the destination holds; the lanes of a round merge theirs and
    the round applies the union in one store transaction (it was one per lane)."""
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=InFlight(delay=0.05),
                     application=received)
    policy = fast_policy(send_concurrency=4, base_retransmission_interval=5.0)
    client = ReliableEngine("memory:", policy, name="client")
    applied: list[int] = []
    apply_ack = client.source._apply_ack

    def counting(*args, **kwargs):
        applied.append(1)
        return apply_ack(*args, **kwargs)

    rounds: list[tuple[int, int]] = []  # (lanes, acknowledgements applied by the round)
    run_lanes = client.retransmission._run_lanes

    def watching(lanes, exchanges):
        before = len(applied)
        run_lanes(lanes, exchanges)
        rounds.append((len(lanes), len(applied) - before))

    client.source._apply_ack = counting
    client.retransmission._run_lanes = watching
    for i in range(24):
        client.send(server.endpoint_address, payload(f"a{i}"), action=ACTION, key="a")
    client.start()
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 24), \
            client.status()
    finally:
        client.stop(timeout=5)
    assert received.snapshot() == [f"a{i}" for i in range(24)]
    assert any(lanes >= 2 for lanes, _ in rounds), rounds  # some round was pipelined
    assert all(acks == 1 for _, acks in rounds), rounds  # one sequence: one application per round
