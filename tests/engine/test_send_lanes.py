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

import pytest

from wsrm_plugin.engine import ReliableEngine, retransmission
from wsrm_plugin.engine.source import SequenceKey

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


def _client_with_backlog(server: ReliableEngine, policy, messages: dict[str, int],
                         store: str = "memory:") -> ReliableEngine:
    """A client whose messages are all enqueued before it starts, so one round claims them together."""
    client = ReliableEngine(store, policy, name="client")
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
    apply_ack = client.source._acknowledged  # an acknowledgement applied, whichever way

    def counting(*args, **kwargs):
        applied.append(1)
        return apply_ack(*args, **kwargs)

    rounds: list[tuple[int, int]] = []  # (lanes, acknowledgements applied by the round)
    run_lanes = client.retransmission._run_lanes

    def watching(lanes, exchanges):
        before = len(applied)
        run_lanes(lanes, exchanges)
        rounds.append((len(lanes), len(applied) - before))

    client.source._acknowledged = counting
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


class Gathering(InFlight):
    """A service that holds each application message until ``gather`` are in flight at once (or
    ``patience`` seconds passed), then lets everything through: a sender that keeps fewer in
    flight waits out the patience with each request (kept below the sender's HTTP timeout)."""

    def __init__(self, gather: int, patience: float) -> None:
        super().__init__(delay=0.0)
        self.gather = gather
        self.patience = patience
        self._gathered = threading.Condition()
        self._waiting = 0
        self.gathered = False

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def held(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if _APPLICATION_MESSAGE.search(environ["wsgi.input"].getvalue()):
                with self._gathered:
                    self._waiting += 1
                    self._gathered.notify_all()
                    if self._waiting >= self.gather:
                        self.gathered = True
                    self._gathered.wait_for(lambda: self.gathered, timeout=self.patience)
                try:
                    return list(app(environ, start_response))
                finally:
                    with self._gathered:
                        self._waiting -= 1
            return app(environ, start_response)

        return super().__call__(held)


def _gathering_server(engines, watch: Gathering, received: Recorder) -> ReliableEngine:
    """An engine serving with enough HTTP threads that the service, not the server, holds requests."""
    server = engines("memory:", fast_policy(), application=received)
    server.serve(middleware=watch, threads=24)
    return server


def test_by_default_the_requests_in_flight_grow_with_the_sequences_due(engines):
    """16 sequences due: one request each in flight at once, not the 4 a fixed pool allowed."""
    watch = Gathering(gather=12, patience=10.0)
    received = Recorder()
    server = _gathering_server(engines, watch, received)
    client = _client_with_backlog(server, fast_policy(base_retransmission_interval=30.0, http_timeout=30.0),
                                  {key: 2 for key in "abcdefghijklmnop"})
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 32, timeout=60), \
            client.status()
        assert client.status().retransmissions == 0  # nothing was held past the HTTP timeout
    finally:
        client.stop(timeout=5)
    assert watch.gathered and watch.most_sequences >= 12, watch.most_sequences  # they went out together
    assert watch.most_per_sequence == 1  # never two of one sequence: each in order on its lane
    assert _by_key(received.snapshot()) == {key: [f"{key}0", f"{key}1"] for key in "abcdefghijklmnop"}


def test_send_concurrency_caps_the_requests_in_flight_whatever_the_sequences_due(engines):
    watch = Gathering(gather=5, patience=0.3)  # never 5 at once: each request waits out the patience
    received = Recorder()
    server = _gathering_server(engines, watch, received)
    client = _client_with_backlog(server, fast_policy(send_concurrency=4, base_retransmission_interval=30.0),
                                  {key: 1 for key in "abcdefgh"})
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 8, timeout=60), \
            client.status()
    finally:
        client.stop(timeout=5)
    assert watch.most_sequences == 4


def test_a_sequence_sent_one_message_at_a_time_has_one_request_in_flight_and_no_lanes(engines):
    """A caller that waits for each message's acknowledgement keeps one sequence with one message
    due: one request in flight, sent by the sender's own thread (no lane thread started)."""
    watch = InFlight(delay=0.02)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    client = engines("memory:", fast_policy(), name="client")
    lanes_before = {t.ident for t in threading.enumerate() if t.name.startswith("wsrm-send")}
    for i in range(6):
        client.send(server.endpoint_address, payload(f"a{i}"), action=ACTION, key="a")
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == i + 1), \
            client.status()
    assert watch.most_per_sequence == 1 and watch.most_sequences == 1
    assert {t.ident for t in threading.enumerate() if t.name.startswith("wsrm-send")} == lanes_before
    assert received.snapshot() == [f"a{i}" for i in range(6)]


class Unavailable(InFlight):
    """A service that answers its application messages 503 (as a gateway does for a peer that is
    down) while ``down`` is set; ``since(moment)``: the most requests in flight at once after it."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.down = True
        self._starts: list[tuple[float, float]] = []  # (start, end) of each refused request

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def refusing(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            if not self.down or not _APPLICATION_MESSAGE.search(environ["wsgi.input"].getvalue()):
                return app(environ, start_response)  # CreateSequence is answered: the sequences start
            start = time.monotonic()
            time.sleep(self.delay)  # InFlight's own delay is spent after this answer is decided
            start_response("503 Service Unavailable", [("Content-Type", "text/plain"), ("Retry-After", "1")])
            with self._lock:
                self._starts.append((start, time.monotonic()))
            return [b"down"]

        return super().__call__(refusing)

    def most_at_once_after(self, moment: float) -> tuple[int, int]:
        """(requests refused that started after ``moment``, the most of them in flight at once)."""
        with self._lock:
            spans = [(s, e) for s, e in self._starts if s >= moment]
        most = max((sum(1 for s, e in spans if s <= start < e) for start, _ in spans), default=0)
        return len(spans), most


def test_an_unreachable_peer_gets_one_request_at_a_time_from_the_grown_lanes(engines):
    """16 sequences due to a peer that turns everything away: the round's 16 lanes meet the 503s
    together, the peer is judged unreachable, and from then on one probe at a time goes to it
    (the breaker is per peer, not per lane); once it answers, everything is delivered."""
    watch = Unavailable(delay=0.05)
    received = Recorder()
    server = engines("memory:", fast_policy(), application=received)
    server.serve(middleware=watch, threads=24)
    keys = "abcdefghijklmnop"
    policy = fast_policy(exponential_backoff=True, max_retransmission_interval=1.0)
    client = _client_with_backlog(server, policy, {key: 2 for key in keys})
    try:
        assert wait_for(lambda: client.status().unreachable_peers != (), timeout=30), client.status()
        # from the first probe on: the round's lanes that were past the breaker when it opened are done
        assert wait_for(lambda: client.status().probes_sent >= 1, timeout=30), client.status()
        probing = time.monotonic()
        assert wait_for(lambda: watch.most_at_once_after(probing)[0] >= 3, timeout=30)  # a few probes
        refused, most = watch.most_at_once_after(probing)
        assert most == 1, (refused, most)
        assert watch.most_sequences >= 8  # before the judgement the lanes did go out together
        watch.down = False
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 32, timeout=60), \
            client.status()
        assert client.status().faulted_sequences == 0
    finally:
        client.stop(timeout=5)
    assert _by_key(received.snapshot()) == {key: [f"{key}0", f"{key}1"] for key in keys}


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_rounds_acknowledgements_are_applied_in_one_transaction_on_sqlite(engines, monkeypatch, tmp_path,
                                                                            kind):
    """The lanes of one round merge their sequences' acknowledgements, and on SQLite the round
    applies them all in one store transaction (16 sequences took 16 transactions, each a turn on
    the file and its commit); where rows are locked one by one (memory, PostgreSQL) each sequence's
    stays a transaction of its own, which holds no other sequence's row while it waits for one.
    Each sequence's messages are acknowledged and released as before."""
    from wsrm_plugin.engine.source import Source

    applied: dict[int, set[str]] = {}
    kept: list[Any] = []  # the transactions, alive: their ids stay theirs
    real = Source._acknowledged  # an acknowledgement applied, whichever way

    def watched(self, tx, seq, *args):
        kept.append(tx)
        applied.setdefault(id(tx), set()).add(seq.key)
        return real(self, tx, seq, *args)

    monkeypatch.setattr(Source, "_acknowledged", watched)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=InFlight(delay=0.05), application=received)
    policy = fast_policy(send_concurrency=4, base_retransmission_interval=5.0)
    store = f"sqlite:///{tmp_path}/client.db" if kind == "sqlite" else "memory:"
    client = _client_with_backlog(server, policy, {"a": 3, "b": 3, "c": 3, "d": 3}, store)
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 12), \
            client.status()
    finally:
        client.stop(timeout=5)
    if kind == "sqlite":
        assert max(len(keys) for keys in applied.values()) >= 2, applied
    else:
        assert max(len(keys) for keys in applied.values()) == 1, applied
    assert _by_key(received.snapshot()) == {key: [f"{key}{i}" for i in range(3)] for key in "abcd"}


class CreatesInFlight:
    """WSGI middleware: each CreateSequence takes ``delay`` seconds; the most in flight at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.most = 0
        self._now = 0
        self._lock = threading.Lock()

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def middleware(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            if not re.search(rb"<(\w+:)?CreateSequence[\s>]", body):
                return app(environ, start_response)
            with self._lock:
                self._now += 1
                self.most = max(self.most, self._now)
            try:
                time.sleep(self.delay)
                return list(app(environ, start_response))
            finally:
                with self._lock:
                    self._now -= 1

        return middleware


def test_new_sequences_are_created_at_once_each_on_a_lane(engines):
    """Callers opening several sequences together: their CreateSequence exchanges go out side by
    side on the sending lanes (one after the other, the last sequence's messages waited for
    every other sequence's creation)."""
    watch = CreatesInFlight(delay=0.2)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    policy = fast_policy(send_concurrency=4, base_retransmission_interval=5.0)
    client = _client_with_backlog(server, policy, {"a": 2, "b": 2, "c": 2, "d": 2})
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 8), \
            client.status()
    finally:
        client.stop(timeout=5)
    assert watch.most >= 2
    assert _by_key(received.snapshot()) == {key: [f"{key}{i}" for i in range(2)] for key in "abcd"}


class SlowFor(InFlight):
    """InFlight whose application messages of the keys in ``slow`` (their items' first letter)
    take ``slow_delay`` seconds, the others ``delay``."""

    def __init__(self, delay: float, slow: str, slow_delay: float) -> None:
        super().__init__(delay)
        self.slow = slow
        self.slow_delay = slow_delay

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def slowed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            text = item_text(environ["wsgi.input"].getvalue()) if _APPLICATION_MESSAGE.search(
                environ["wsgi.input"].getvalue()) else None
            if text is not None and text[0] in self.slow:
                time.sleep(self.slow_delay - self.delay)
            return app(environ, start_response)

        return super().__call__(slowed)


def test_a_lane_done_with_its_rounds_messages_takes_more_of_its_sequence_while_another_lane_sends(engines):
    """A round of two sequences, one of them slow at the service: the fast one's lane does not
    wait for the slow one to end the round, it claims and sends its sequence's next messages
    (each claim recording the attempts before the send, as a round's does).  Without that its
    next messages waited for the next round, after the slow lane's second message."""
    watch = SlowFor(delay=0.02, slow="b", slow_delay=1.5)
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    policy = fast_policy(send_concurrency=4, send_batch=4, base_retransmission_interval=30.0)
    client = _client_with_backlog(server, policy, {"a": 6, "b": 2})
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 8, timeout=60), \
            client.status()
    finally:
        client.stop(timeout=5)
    arrived = [text for _, text in watch.arrivals]
    assert arrived.index("a5") < arrived.index("b1"), arrived  # a's lane went on while b's sent b0
    assert client.retransmission.refilled >= 4, client.retransmission.refilled
    assert client.retransmission.retransmissions == 0  # each sent once: the claims counted their attempts
    assert _by_key(received.snapshot()) == {"a": [f"a{i}" for i in range(6)], "b": ["b0", "b1"]}


class HoldUntil(InFlight):
    """InFlight whose application message ``held`` waits (up to ``limit`` seconds) until the one
    named ``until`` has arrived: another lane of the round sends meanwhile, whatever the
    machine's speed."""

    def __init__(self, delay: float, held: str, until: str, limit: float) -> None:
        super().__init__(delay)
        self.held, self.until, self.limit = held, until, limit
        self.came = threading.Event()

    def __call__(self, app: Callable[..., Any]) -> Callable[..., Any]:
        def holding(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            body = environ["wsgi.input"].getvalue()
            text = item_text(body) if _APPLICATION_MESSAGE.search(body) else None
            if text == self.until:
                self.came.set()
            elif text == self.held:
                self.came.wait(self.limit)
            return app(environ, start_response)

        return super().__call__(holding)


def _send_backlog(engines, watch: InFlight, policy: Any, backlog: dict[str, int] | None = None
                  ) -> tuple[ReliableEngine, Recorder, dict[str, int]]:
    """``backlog`` (a's 34 messages and b..i's 2 each unless given) through ``watch``, a's flow
    pipelined already (a flow starts in order, 2 at a time: its claims' limit is then
    send_batch); returns once all arrived."""
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    backlog = backlog or {"a": 34, **{key: 2 for key in "bcdefghi"}}
    client = ReliableEngine("memory:", policy, name="client")
    flow = client.retransmission.flow_of(SequenceKey(server.endpoint_address, "a", 1, False).encode(), create=True)
    assert flow is not None
    flow.pipeline()
    for key, count in backlog.items():
        for i in range(count):
            client.send(server.endpoint_address, payload(f"{key}{i}"), action=ACTION, key=key)
    client.start()
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == sum(backlog.values()),
                        timeout=60), client.status()
    finally:
        client.stop(timeout=5)
    return client, received, backlog


def test_a_lanes_refills_take_many_messages_each(engines, monkeypatch):
    """A round's claim gives each of many sequences its share of ``send_batch`` (here 16 over 9
    sequences: a gets one or two); a lane that sent its share of a long backlog while another lane
    still sends claims 16 at a time (as many as its flow allows), not as few as it sent: each
    claim is a store transaction.  Without it, a's lane took 4 refills of 2 and left the rest to
    the next round, after b0.  (The round stays open as long as it takes, whatever the machine's
    speed.)"""
    monkeypatch.setattr(retransmission, "_ROUND_OPEN", 60.0)
    watch = HoldUntil(delay=0.01, held="b0", until="a33", limit=20.0)
    policy = fast_policy(send_concurrency=16, send_batch=16, base_retransmission_interval=30.0, http_timeout=30.0)
    client, received, backlog = _send_backlog(engines, watch, policy)
    arrived = [text for _, text in watch.arrivals]
    assert arrived.index("a33") < arrived.index("b1"), arrived  # all of a while b0 was held
    assert client.retransmission.retransmissions == 0
    assert _by_key(received.snapshot()) == {key: [f"{key}{i}" for i in range(n)] for key, n in backlog.items()}


def test_a_lane_sending_past_its_first_messages_retransmission_time_goes_on_refilling(engines, monkeypatch):
    """A round applies its lanes' acknowledgements at its end.  A lane that sends longer than the
    retransmission interval has its first messages due again in the store (acknowledged only in
    memory): a claim of first sends found a retransmission due first and took nothing, so the
    lane ended and its backlog waited for the round's end (here b0 is held until a's last
    message arrives).  The lane's claim now passes over the messages its round's answers
    acknowledged, and writes nothing more for it."""
    monkeypatch.setattr(retransmission, "_ROUND_OPEN", 60.0)
    watch = HoldUntil(delay=0.03, held="b0", until="a33", limit=10.0)
    policy = fast_policy(send_concurrency=16, send_batch=16, base_retransmission_interval=0.3, http_timeout=30.0)
    client, received, backlog = _send_backlog(engines, watch, policy)
    arrived = [text for _, text in watch.arrivals]
    assert arrived.index("a33") < arrived.index("b1"), arrived  # all of a in the round that held b0
    assert client.retransmission.refilled >= 32  # a's messages after its round's first ones: its lane's
    assert _by_key(received.snapshot()) == {key: [f"{key}{i}" for i in range(n)] for key, n in backlog.items()}


def test_a_lane_goes_on_with_its_sequence_while_another_lane_sends_however_many_it_took(engines, monkeypatch):
    """No count of refills ends a lane: while another lane of its round still sends (and the round
    is open) it takes its sequence's next messages, here all of a's 100 while b0 is held.  With at
    most four refills, a's lane ended after 66 and its slot idled until b's lane ended the round
    (lanes idle at their rounds' ends 12-30% of the time at 16 sequences)."""
    monkeypatch.setattr(retransmission, "_ROUND_OPEN", 60.0)
    watch = HoldUntil(delay=0.005, held="b0", until="a99", limit=20.0)
    policy = fast_policy(send_concurrency=16, send_batch=16, base_retransmission_interval=30.0, http_timeout=30.0)
    client, received, _ = _send_backlog(engines, watch, policy, {"a": 100, "b": 2})
    arrived = [text for _, text in watch.arrivals]
    assert arrived.index("a99") < arrived.index("b1"), arrived
    assert client.retransmission.lane_ends_closed == 0
    assert _by_key(received.snapshot()) == {"a": [f"a{i}" for i in range(100)], "b": ["b0", "b1"]}


def test_a_lane_takes_no_more_of_its_sequence_while_another_sequence_waits_for_a_lane(engines):
    """Two lanes (``send_concurrency``) for a round of four sequences: a lane that has sent its
    share does not go on with its sequence while the round's other sequences wait for a thread;
    it makes room for them.  Going on until the round closed kept c and d out of it."""
    watch = InFlight(delay=0.1)  # each lane's first message goes well before another's third
    received = Recorder()
    server = engines("memory:", fast_policy(), serve=True, middleware=watch, application=received)
    policy = fast_policy(send_concurrency=2, send_batch=8, base_retransmission_interval=30.0, http_timeout=30.0)
    client = _client_with_backlog(server, policy, {key: 20 for key in "abcd"})
    try:
        assert wait_for(lambda: client.status().unacked == 0 and len(received.snapshot()) == 80, timeout=60), \
            client.status()
    finally:
        client.stop(timeout=5)
    arrived = [text for _, text in watch.arrivals]
    assert arrived.index("c0") < arrived.index("a2") and arrived.index("d0") < arrived.index("b2"), arrived
    assert _by_key(received.snapshot()) == {key: [f"{key}{i}" for i in range(20)] for key in "abcd"}
