"""A service serving from a SQLite store shortens the interpreter's switch interval while it serves.

The thread holding the store's file lets go of the interpreter at each SQLite statement and at
the application's own commit; at Python's 5 ms interval it may then wait that long for it,
inside the hold that bounds the service's rate (``wsrm_plugin.engine.switch_interval``).  The
setting is process-wide, so: only on a SQLite store, never over the application's own value,
logged once, put back at stop, and ``RMPolicy.interpreter_switch_interval`` decides.
"""

from __future__ import annotations

import logging
import sys

import pytest

from wsrm_plugin.engine import ReliableEngine, RMPolicy
from wsrm_plugin.engine.switch_interval import AUTOMATIC_SWITCH_INTERVAL, PYTHON_SWITCH_INTERVAL

LOGGER = "wsrm_plugin.engine.switch_interval"


@pytest.fixture(autouse=True)
def python_default():
    before = sys.getswitchinterval()
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(before)


def _changes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


def test_serving_from_sqlite_shortens_the_interval_logs_it_once_and_puts_it_back(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    one = ReliableEngine(f"sqlite:///{tmp_path}/one.db")
    two = ReliableEngine(f"sqlite:///{tmp_path}/two.db")
    try:
        one.serve(threads=1)
        assert sys.getswitchinterval() == pytest.approx(AUTOMATIC_SWITCH_INTERVAL)
        two.serve(threads=1)
        assert len(_changes(caplog)) == 1, _changes(caplog)
        assert "0.005 -> 0.001" in _changes(caplog)[0]
        one.stop(timeout=5)
        assert sys.getswitchinterval() == pytest.approx(AUTOMATIC_SWITCH_INTERVAL)  # two still serves
    finally:
        one.stop(timeout=5)
        two.stop(timeout=5)
    assert sys.getswitchinterval() == pytest.approx(PYTHON_SWITCH_INTERVAL)


def test_the_applications_own_interval_is_kept(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    sys.setswitchinterval(0.002)
    engine = ReliableEngine(f"sqlite:///{tmp_path}/s.db")
    try:
        engine.serve(threads=1)
        assert sys.getswitchinterval() == pytest.approx(0.002)
    finally:
        engine.stop(timeout=5)
    assert sys.getswitchinterval() == pytest.approx(0.002)
    assert _changes(caplog) == []


def test_false_leaves_it_and_other_stores_leave_it_unless_told(tmp_path):
    off = ReliableEngine(f"sqlite:///{tmp_path}/off.db", RMPolicy(interpreter_switch_interval=False))
    memory = ReliableEngine("memory:")
    try:
        off.serve(threads=1)
        memory.serve(threads=1)
        assert sys.getswitchinterval() == pytest.approx(PYTHON_SWITCH_INTERVAL)
    finally:
        off.stop(timeout=5)
        memory.stop(timeout=5)
    told = ReliableEngine("memory:", RMPolicy(interpreter_switch_interval=0.0005))
    try:
        told.serve(threads=1)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        told.stop(timeout=5)
    assert sys.getswitchinterval() == pytest.approx(PYTHON_SWITCH_INTERVAL)


def test_an_interval_changed_while_serving_is_not_put_back(tmp_path):
    engine = ReliableEngine(f"sqlite:///{tmp_path}/s.db")
    try:
        engine.serve(threads=1)
        sys.setswitchinterval(0.003)  # the application's, after the engine's
    finally:
        engine.stop(timeout=5)
    assert sys.getswitchinterval() == pytest.approx(0.003)


@pytest.mark.parametrize("value", [0, -1, True, "0.001"])
def test_the_knob_refuses_what_is_not_an_interval(value):
    with pytest.raises(ValueError, match="interpreter_switch_interval"):
        RMPolicy(interpreter_switch_interval=value)
