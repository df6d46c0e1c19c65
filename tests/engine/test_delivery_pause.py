"""The delivery pause's clock, back-off and reporting (wsrm_plugin.engine.outage.DeliveryPause), on
a clock the test turns: no engine, no waiting."""

from __future__ import annotations

import logging

import pytest

from wsrm_plugin.engine.outage import DeliveryPause, PauseRecord
from wsrm_plugin.engine.policy import RMPolicy
from wsrm_plugin.statemachine import ServiceAction, ServiceMode

A = ServiceAction


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def made():
    clock = Clock()
    records: list[PauseRecord] = []
    woken: list[bool] = []
    pause = DeliveryPause(RMPolicy(outage_probe_delay=0.5, max_outage_probe_delay=5.0, poll_interval=0.2),
                          "orders", record=records.append, wake=lambda: woken.append(True), clock=clock)
    return pause, clock, records, woken


def _probe_when_due(pause: DeliveryPause, clock: Clock) -> float:
    """Turn the clock to the next probe; how long that was."""
    waited = pause.next_probe_in()
    clock.now += waited
    assert pause.take_probe()
    return waited


def test_two_outage_failures_pause_and_each_failed_probe_doubles_the_wait_up_to_the_cap(made, caplog):
    pause, clock, records, woken = made
    caplog.set_level(logging.DEBUG)
    assert pause.outage(ConnectionRefusedError("refused")) == (A.SUSPECT_MESSAGE,)
    assert not pause.paused
    assert pause.outage(ConnectionRefusedError("refused")) == (A.PAUSE,)
    assert pause.paused and pause.since is not None and "ConnectionRefusedError: refused" in (pause.error or "")
    assert not pause.take_probe()  # not before its back-off
    waits = []
    for _ in range(8):
        waits.append(_probe_when_due(pause, clock))
        assert not pause.take_probe()  # one probe at a time
        assert pause.outage(TimeoutError("still down")) == (A.BACK_OFF,)
    # 0.5, 1, 2, 4, then the cap; each less up to a quarter of jitter, never above
    for wait, full in zip(waits, [0.5, 1, 2, 4, 5, 5, 5, 5], strict=True):
        assert 0.75 * full - 1e-9 <= wait <= full + 1e-9, waits
    assert pause.error == "TimeoutError: still down" and pause.probes == 8
    _probe_when_due(pause, clock)
    assert pause.delivered() == (A.RESUME,)
    assert not pause.paused and pause.since is None and pause.error is None and woken == [True]
    # told once each way; the store heard of the pause, each failed probe and the resumption
    assert [r.levelname for r in caplog.records if "PAUSED" in r.getMessage()] == ["WARNING"]
    assert [r.levelname for r in caplog.records if "RESUMED" in r.getMessage()] == ["INFO"]
    assert [r.mode for r in records] == [ServiceMode.PAUSED] * 9 + [ServiceMode.RUNNING]


def test_a_success_between_two_failures_is_no_pause_and_charges_the_suspect(made):
    pause, _, records, _ = made
    pause.outage(ConnectionRefusedError())
    assert pause.delivered() == (A.CHARGE_SUSPECTS,)
    assert pause.mode is ServiceMode.RUNNING and records == []
    assert pause.delivered() == () and pause.failed() == ()  # running: nothing to do, no lock taken


@pytest.mark.parametrize("threshold", [1, 2, 4])
def test_the_pause_threshold_counts_outage_failures_since_the_last_success(threshold):
    pause = DeliveryPause(RMPolicy(pause_after_outage_failures=threshold), "orders")
    for _ in range(2):  # the second time round: a success in between started the count again
        for _ in range(threshold - 1):
            assert pause.outage(ConnectionRefusedError()) == (A.SUSPECT_MESSAGE,)
            assert pause.failed() == ()  # a message's own failure neither counts nor resets
        if threshold > 1:
            assert pause.delivered() == (A.CHARGE_SUSPECTS,) and not pause.paused
    for _ in range(threshold - 1):
        pause.outage(ConnectionRefusedError())
    assert pause.outage(ConnectionRefusedError()) == (A.PAUSE,) and pause.paused
    assert pause.take_probe() is False  # its back-off first
    pause.delivered()
    # after a pause the count starts again from nothing
    assert pause.outage(ConnectionRefusedError()) == ((A.PAUSE,) if threshold == 1 else (A.SUSPECT_MESSAGE,))


def test_the_pause_threshold_is_a_count_of_one_or_more():
    with pytest.raises(ValueError, match="pause_after_outage_failures must be an int >= 1"):
        RMPolicy(pause_after_outage_failures=0)


def test_a_probe_that_finds_nothing_due_tries_again_soon_and_one_with_nothing_waiting_resumes(made):
    pause, clock, _, woken = made
    pause.outage(OSError())
    pause.outage(ConnectionResetError())
    for _ in range(3):  # grow the back-off
        _probe_when_due(pause, clock)
        pause.outage(ConnectionResetError())
    _probe_when_due(pause, clock)
    pause.probe_ended_empty()
    assert pause.mode is ServiceMode.PAUSED and pause.next_probe_in() <= 0.2 + 1e-6  # the poll interval, not 4 s
    _probe_when_due(pause, clock)
    assert pause.nothing_waiting() == (A.RESUME,) and woken == [True]
    assert pause.nothing_waiting() == ()  # only a probe can find nothing waiting


def test_a_failing_store_does_not_stop_the_pause(made):
    clock = Clock()

    def broken(record: PauseRecord) -> None:
        raise OSError("the store is down too")

    pause = DeliveryPause(RMPolicy(), "orders", record=broken, clock=clock)
    pause.outage(ConnectionRefusedError())
    assert pause.outage(ConnectionRefusedError()) == (A.PAUSE,) and pause.paused
    assert pause.status() == {"paused": True, "paused_since": pause.since,
                              "pause_error": "ConnectionRefusedError: "}
