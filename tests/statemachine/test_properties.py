"""Property tests: random event sequences, random message arrival orders, AckRanges vs a set,
and the three machines driven together over a lossy network until everything is delivered."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wsrm_plugin.statemachine import (
    AckRanges,
    InvalidTransition,
    InvokerDuty,
    InvokerEvent,
    InvokerState,
    PeerEvent,
    PeerState,
    Reason,
    RMDAction,
    RMDEvent,
    RMDState,
    RMSDuty,
    RMSEvent,
    RMSState,
    invoker_duties,
    invoker_transition,
    peer_transition,
    rmd_receive,
    rmd_transition,
    rms_acknowledge,
    rms_duties,
    rms_transition,
)

from . import test_invoker, test_peer, test_rmd, test_rms

MACHINES = [
    (RMSState, rms_transition, RMSEvent, [RMSState.initial(), RMSState.initial(offered=True)], test_rms.VALID),
    (RMDState, rmd_transition, RMDEvent, [RMDState.initial()], test_rmd.VALID),
    (InvokerState, invoker_transition, InvokerEvent, [InvokerState.initial()], test_invoker.VALID),
    (PeerState, peer_transition, PeerEvent, [PeerState.initial()], test_peer.VALID),
]


@given(st.data())
def test_random_event_sequences_never_reach_an_invalid_state(data):
    state_cls, fn, events, initial, valid_labels = data.draw(st.sampled_from(MACHINES))
    valid = {state_cls.of(label) for label in valid_labels}
    state = data.draw(st.sampled_from(initial))
    for event in data.draw(st.lists(st.sampled_from(list(events)), max_size=40)):
        try:
            result = fn(state, event)
        except InvalidTransition as error:
            assert error.state == state  # refused: nothing changes
            continue
        assert result.previous == state
        assert result.state in valid
        assert state_cls.is_valid(**result.state.factors())
        state = result.state


@st.composite
def arrivals(draw):
    """Numbers 1..n, some never arriving, some arriving several times, in any order."""
    n = draw(st.integers(1, 25))
    arriving = [k for k in range(1, n + 1) if draw(st.booleans()) or draw(st.booleans())]
    copies = [k for k in arriving for _ in range(draw(st.integers(1, 3)))]
    return n, draw(st.permutations(copies))


@given(arrivals())
def test_rmd_has_every_message_exactly_when_all_numbers_arrived(case):
    n, order = case
    state, received, last_number = RMDState.initial(), AckRanges(), None
    seen: set[int] = set()
    for number in order:
        r = rmd_receive(state, number, last=(number == n), received=received, last_number=last_number)
        assert r.duplicate == (number in seen)
        seen.add(number)
        state, received, last_number = r.transition.state, r.received, r.last_number
        assert state.first_message_received
        assert state.last_message_received == (n in seen)
        assert state.every_message_received == seen.issuperset(range(1, n + 1))
        assert r.event in (RMDEvent.AMR_SC, RMDEvent.LMR_SC) or not (
            state.every_message_received and not r.transition.previous.every_message_received
        )
        assert AckRanges.of(seen) == received
    assert state.every_message_received == seen.issuperset(range(1, n + 1))


numbers = st.integers(1, 60)


@given(st.lists(numbers), st.lists(numbers), st.lists(st.integers(0, 62)))
def test_ack_ranges_behave_like_a_set(xs, ys, probes):
    a = AckRanges()
    for x in xs:
        a = a.add(x)
    b = AckRanges.of(ys)
    sa, sb = set(xs), set(ys)
    assert a == AckRanges.of(xs) == AckRanges.from_ranges((x, x) for x in xs)
    for p in probes:
        assert (p in a) == (p in sa)
        assert a.is_complete_up_to(p) == sa.issuperset(range(1, p + 1))
        assert set(_numbers(a.missing_up_to(p))) == set(range(1, p + 1)) - sa
    assert set(_numbers(a)) == sa and a.count == len(sa)
    assert set(_numbers(a.union(b))) == sa | sb
    assert set(_numbers(a.difference(b))) == sa - sb
    assert a.highest == max(sa, default=0)
    assert a.next_expected == min(set(range(1, 62)) - sa)
    # bounded: one range per maximal run of consecutive numbers, never more
    runs = sum(1 for x in sa if x - 1 not in sa)
    assert len(a.ranges) == runs


def _numbers(r: AckRanges) -> list[int]:
    return [k for lower, upper in r.ranges for k in range(lower, upper + 1)]


@given(st.integers(0, 20), st.lists(st.lists(st.integers(1, 24), min_size=1)))
def test_rms_acknowledgements_match_a_set_model(assigned, acks):
    state = RMSState.of("SS MIB") if assigned else RMSState.of("SS")
    acked, model = AckRanges(), set()
    for numbers in acks:
        ack = AckRanges.of(numbers)
        if max(numbers) > assigned:
            try:
                rms_acknowledge(state, ack, acked=acked, highest_assigned=assigned)
            except InvalidTransition as error:
                assert error.reason is Reason.INVALID_ACKNOWLEDGEMENT
            else:
                raise AssertionError(f"ack {ack} with only {assigned} sent was accepted")
            continue
        out = rms_acknowledge(state, ack, acked=acked, highest_assigned=assigned)
        model |= set(numbers)
        assert set(_numbers(out.newly_acked)) == set(numbers) - set(_numbers(acked))
        state, acked = out.transition.state, out.acked
        assert set(_numbers(acked)) == model
        assert state.messages_in_buffer == (not model.issuperset(range(1, assigned + 1)))


class LossyRun:
    """A client RMS, a server RMD and invoker buffer, each worker acting only on its duties,
    joined by a network that drops whatever the test data says.  The state machines are the
    only logic; the bookkeeping is what a store would keep."""

    def __init__(self, data, count: int, close_first: bool) -> None:
        self.data, self.count, self.close_first = data, count, close_first
        self.healed = False
        self.rms: RMSState | None = None
        self.assigned, self.acked, self.app_sent, self.app_done = 0, AckRanges(), 0, False
        self.rmd: RMDState | None = None
        self.received, self.last_number = AckRanges(), None
        self.invoker = InvokerState.initial()
        self.next_available, self.available, self.delivered = 1, [], []

    def network(self) -> bool:
        return self.healed or self.data.draw(st.booleans())

    # application
    def app(self) -> None:
        if self.app_sent < self.count:
            self.rms = RMSState.initial() if self.rms is None else rms_transition(self.rms, RMSEvent.AMR).state
            self.assigned += 1
            self.app_sent += 1
        elif not self.app_done:
            self.rms = rms_transition(self.rms, RMSEvent.LMR).state
            self.app_done = True

    # server side
    def rmd_apply(self, event: RMDEvent) -> None:
        self._invoker_follows(rmd_transition(self.rmd, event))

    def _invoker_follows(self, result) -> None:
        self.rmd = result.state
        if RMDAction.ACCEPT_MESSAGE in result.actions:  # in order: hand over the new contiguous run
            run = list(range(self.next_available, self.received.next_expected))
            self.next_available = self.received.next_expected
            if RMDAction.COMPLETE_DELIVERY in result.actions:
                assert run
                self.invoker = invoker_transition(self.invoker, InvokerEvent.LMR).state
            elif run:
                self.invoker = invoker_transition(self.invoker, InvokerEvent.AMR).state
            self.available += run
        if RMDAction.END_DELIVERY in result.actions:
            self.invoker = invoker_transition(self.invoker, InvokerEvent.END).state

    def message_arrives(self, number: int, marked_last: bool) -> None:
        r = rmd_receive(self.rmd, number, last=marked_last, received=self.received, last_number=self.last_number)
        self.received, self.last_number = r.received, r.last_number
        self._invoker_follows(r.transition)
        if self.network():  # the acknowledgement back
            out = rms_acknowledge(self.rms, self.received, acked=self.acked, highest_assigned=self.assigned)
            self.rms, self.acked = out.transition.state, out.acked

    def rms_worker(self) -> None:
        if self.rms is None:
            return
        for duty in rms_duties(self.rms, close_first=self.close_first):
            if duty is RMSDuty.SEND_CREATE_SEQUENCE and self.network():
                self.rmd = self.rmd or RMDState.initial()
                if self.network():
                    self.rms = rms_transition(self.rms, RMSEvent.CRR).state
            elif duty is RMSDuty.SEND_MESSAGES:
                for number in range(1, self.assigned + 1):
                    if number not in self.acked and self.network():
                        marked = not self.close_first and self.rms.last_message_received and number == self.assigned
                        self.message_arrives(number, marked)
            elif duty is RMSDuty.SEND_CLOSE and self.network():
                self.rmd_apply(RMDEvent.CLOSE_RECEIVED)
                if self.network():
                    self.rms = rms_transition(self.rms, RMSEvent.CLOSE_RESPONSE).state
            elif duty is RMSDuty.SEND_TERMINATE:
                if self.network():
                    self.rmd_apply(RMDEvent.TMR)
                self.rms = rms_transition(self.rms, RMSEvent.TERMINATE_SENT).state

    def invoker_worker(self) -> None:
        if InvokerDuty.DELIVER in invoker_duties(self.invoker):
            self.delivered += self.available
            self.available = []
            self.invoker = invoker_transition(self.invoker, InvokerEvent.SAM).state

    def finished(self) -> bool:
        return (
            self.rms is not None
            and rms_duties(self.rms) == {RMSDuty.RELEASE}
            and self.rmd is not None
            and self.rmd.terminate_received
            and self.invoker.finished
        )


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.data(), st.integers(1, 6), st.booleans())
def test_lost_messages_only_delay_delivery_never_lose_or_duplicate_it(data, count, close_first):
    run = LossyRun(data, count, close_first)
    for _ in range(data.draw(st.integers(0, 40))):
        getattr(run, data.draw(st.sampled_from(["app", "rms_worker", "invoker_worker"])))()
    run.healed = True  # from here on the network delivers: the duties alone must finish the job
    for _ in range(4 * count + 10):
        if run.finished():
            break
        run.app()
        run.rms_worker()
        run.invoker_worker()
        if run.rms.terminate_sent and not run.rmd.terminate_received:  # our TerminateSequence was lost
            run.rmd_apply(RMDEvent.INACTIVITY_TIMEOUT)
    assert run.finished(), (run.rms, run.rmd, run.invoker)
    assert run.delivered == list(range(1, count + 1))
    assert not run.rms.faulted
    if close_first:  # 1.1 has no LastMessage: the sequence ends closed, after everything arrived
        assert run.rmd.closed and run.invoker == InvokerState.of("END")
    elif run.rmd.every_message_received:
        assert run.invoker == InvokerState.of("LMR EMS")
