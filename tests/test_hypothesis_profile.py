"""The property tests run with the suite's busy-machine profile (see tests/conftest.py)."""

from hypothesis import HealthCheck, settings


def test_property_tests_have_no_deadline_and_tolerate_slow_generation() -> None:
    assert settings().deadline is None
    assert HealthCheck.too_slow in settings().suppress_health_check
