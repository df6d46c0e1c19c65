"""The service's delivery (statemachine.outage): every mode, every event, reachability."""

from __future__ import annotations

import pytest

from wsrm_plugin.statemachine import Reason, ServiceEvent, ServiceMode, service_transition, transition

from .helpers import NOOP, cells, check_cell, reachable

NOT_PAUSED, U = Reason.NOT_PAUSED, Reason.UNEXPECTED

TABLE = {
    "RUNNING": {"DELIVERED": NOOP, "FAILED": NOOP, "OUTAGE": ("SUSPECT", ["SUSPECT_MESSAGE"]),
                "OUTAGES_IN_A_ROW": ("PAUSED", ["PAUSE"]),
                "PROBE_DUE": NOT_PAUSED, "PROBE_EMPTY": NOT_PAUSED, "NOTHING_WAITING": NOT_PAUSED},
    "SUSPECT": {"DELIVERED": ("RUNNING", ["CHARGE_SUSPECTS"]), "FAILED": NOOP,
                "OUTAGE": ("SUSPECT", ["SUSPECT_MESSAGE"]), "OUTAGES_IN_A_ROW": ("PAUSED", ["PAUSE"]),
                "PROBE_DUE": NOT_PAUSED, "PROBE_EMPTY": NOT_PAUSED, "NOTHING_WAITING": NOT_PAUSED},
    "PAUSED": {"DELIVERED": ("RUNNING", ["RESUME"]), "FAILED": NOOP, "OUTAGE": NOOP, "OUTAGES_IN_A_ROW": NOOP,
               "PROBE_DUE": ("PROBING", ["PROBE"]), "PROBE_EMPTY": U, "NOTHING_WAITING": U},
    "PROBING": {"DELIVERED": ("RUNNING", ["RESUME"]), "FAILED": ("RUNNING", ["RESUME"]),
                "OUTAGE": ("PAUSED", ["BACK_OFF"]), "OUTAGES_IN_A_ROW": ("PAUSED", ["BACK_OFF"]),
                "PROBE_DUE": NOOP, "PROBE_EMPTY": ("PAUSED", []), "NOTHING_WAITING": ("RUNNING", ["RESUME"])},
}


def test_the_table_covers_every_mode_and_event():
    assert set(TABLE) == {m.name for m in ServiceMode}
    for row in TABLE.values():
        assert set(row) == {e.name for e in ServiceEvent}


@pytest.mark.parametrize("label, event, expected", cells(TABLE, ServiceEvent), ids=str)
def test_transition(label, event, expected):
    check_cell(ServiceMode, service_transition, label, event, expected)
    check_cell(ServiceMode, transition, label, event, expected)


def test_every_mode_is_reachable():
    assert reachable({ServiceMode.initial()}, service_transition, ServiceEvent) == set(ServiceMode)


def test_outage_failures_below_the_threshold_are_suspicions_the_threshold_pauses_and_one_success_resumes():
    mode = ServiceMode.initial()
    for event in (ServiceEvent.OUTAGE, ServiceEvent.OUTAGE, ServiceEvent.OUTAGES_IN_A_ROW):
        mode = service_transition(mode, event).state
    assert mode is ServiceMode.PAUSED and mode.paused
    # however many probes fail, the first delivery resumes
    for _ in range(5):
        probing = service_transition(mode, ServiceEvent.PROBE_DUE).state
        mode = service_transition(probing, ServiceEvent.OUTAGES_IN_A_ROW).state
        assert mode is ServiceMode.PAUSED
    mode = service_transition(service_transition(mode, ServiceEvent.PROBE_DUE).state, ServiceEvent.DELIVERED).state
    assert mode is ServiceMode.RUNNING and not mode.paused
    # a success between two failures: no pause, and the suspect is charged
    after = service_transition(ServiceMode.SUSPECT, ServiceEvent.DELIVERED)
    assert after.state is ServiceMode.RUNNING and [a.name for a in after.actions] == ["CHARGE_SUSPECTS"]


def test_foreign_objects_are_refused():
    with pytest.raises(TypeError, match="not a ServiceEvent"):
        service_transition(ServiceMode.RUNNING, "OUTAGE")  # type: ignore[arg-type]
