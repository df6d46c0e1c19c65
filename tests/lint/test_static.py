"""Type checking (mypy) and linting (ruff) of the three packages, as configured in pyproject.toml.

Both run as the project's test command runs everything else, so a type error or a lint finding
fails the suite like any other regression; the output is the failure message.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["txmanager", "wsrm_plugin", "interceptors"]

pytestmark = pytest.mark.timeout(600)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=540)


def test_mypy_reports_nothing() -> None:
    # [tool.mypy] in pyproject.toml names the packages and the settings; no cache, so a stale
    # one from another branch cannot hide an error
    result = _run("mypy", "--no-incremental", "--cache-dir", "/dev/null", *PACKAGES)
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"


def test_ruff_reports_nothing() -> None:
    result = _run("ruff", "check", "--no-cache", *PACKAGES)
    assert result.returncode == 0, f"ruff:\n{result.stdout}{result.stderr}"
