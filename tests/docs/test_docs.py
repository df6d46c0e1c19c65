"""The documentation site builds with warnings as errors, and documents the public API.

``sphinx-build -W -b html docs <tmp>`` exactly as the site's own page says;
then the built reference must hold every public name of ``wsrm_plugin``
(autodoc from the docstrings), and every cross-reference the pages make must
land on a documented object (Sphinx does not warn about those by itself).
"""

from __future__ import annotations

import html
import os
import pathlib
import re
import subprocess
import sys

import pytest

import wsrm_plugin

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ROLE = re.compile(r"\{(?:func|class|attr|meth|mod|data|exc)\}`~?([\w.]+)`")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"sphinx-build -W failed:\n{done.stderr[-8000:]}\n{done.stdout[-2000:]}"
    return out


def _ids(site: pathlib.Path) -> set[str]:
    ids: set[str] = set()
    for page in site.rglob("*.html"):
        ids.update(re.findall(r'id="([\w.]+)"', page.read_text()))
    return ids


def test_the_site_builds_with_warnings_as_errors(site):
    for page in ("index", "quickstart", "concepts", "policy", "reference", "changelog", "deploy",
                 "howto/operate", "howto/http", "howto/spark"):
        assert (site / f"{page}.html").exists(), page


def test_the_concepts_page_draws_the_state_machines_from_their_code(site):
    from wsrm_plugin.statemachine.diagram import machine

    names = ("rms", "rmd", "invoker", "peer", "lane", "delivery", "outage")
    page = (site / "concepts.html").read_text()
    drawings = re.findall(r'(?:src|data)="(_images/graphviz-[0-9a-f]+\.svg)"', page)
    assert len(set(drawings)) == len(names), drawings
    svgs = html.unescape("".join((site / d).read_text() for d in set(drawings)))
    for name in names:
        m = machine(name)
        for state in m.states():  # every state's label is on a node of its drawing
            assert f">{m.label(state)}</text>" in svgs, (name, m.label(state))


def test_the_reference_documents_every_public_name(site):
    ids = _ids(site)
    missing = []
    for name, module in wsrm_plugin._EXPORTS.items():
        value = getattr(wsrm_plugin, name)
        defined = f"{getattr(value, '__module__', module)}.{getattr(value, '__qualname__', name)}"
        if defined not in ids and f"{module}.{name}" not in ids:
            missing.append(defined)
    assert missing == []


def test_every_cross_reference_of_the_pages_lands_on_a_documented_object(site):
    ids = _ids(site)
    targets = {t for page in DOCS.rglob("*.md") for t in ROLE.findall(page.read_text())}
    assert targets, "the pages link no API object at all"
    assert sorted(t for t in targets if t not in ids) == []


def test_the_readme_keeps_its_two_commands_and_links_the_site():
    readme = (ROOT / "README.md").read_text()
    assert "    scripts/demo.sh\n" in readme and "    scripts/test.sh\n" in readme
    assert "docs/" in readme and "sphinx-build -W -b html docs" in readme
    assert "## Make an existing service and client reliable" in readme
