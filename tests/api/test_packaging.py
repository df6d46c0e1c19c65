"""Set-up output and the version: an SPDX license string, ``python -m wsrm_plugin --version``."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tomllib

import wsrm_plugin

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def test_python_m_wsrm_plugin_prints_the_version():
    out = _run(sys.executable, "-m", "wsrm_plugin", "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"wsrm {wsrm_plugin.__version__}"


def test_the_wsrm_command_prints_the_same_version():
    script = pathlib.Path(sys.executable).parent / "wsrm"  # the console script `pip install` made
    assert script.exists(), f"no {script}: install the project (pip install -e .)"
    out = _run(str(script), "--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"wsrm {wsrm_plugin.__version__}"


def test_the_version_has_one_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "wsrm_plugin.__version__"}
    assert wsrm_plugin.__version__.count(".") == 2


def test_the_license_is_an_spdx_expression_setuptools_reads_without_deprecation():
    # setuptools >= 77 reads `license = "Apache-2.0"` (PEP 639); the table form
    # `{ text = ... }` prints a deprecation warning on every set-up run.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    requires = pyproject["build-system"]["requires"]
    setuptools_req = next(r for r in requires if r.startswith("setuptools"))
    assert setuptools_req.replace(" ", "") == "setuptools>=77"
    assert "sphinx>=7" in pyproject["project"]["optional-dependencies"]["test"]
    assert "myst-parser>=2" in pyproject["project"]["optional-dependencies"]["test"]
