"""Sphinx configuration: Markdown pages (MyST) and the API reference from the docstrings (autodoc).

Build it with ``sphinx-build -W -b html docs docs/_build/html`` (warnings are
errors; ``tests/docs/test_docs.py`` runs exactly that).
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # the statemachine directive

import wsrm_plugin  # noqa: E402 -- after the path is set

project = "wsrm-plugin"
author = "the wsrm-plugin authors"
copyright = "the wsrm-plugin authors, Apache-2.0"  # noqa: A001 -- Sphinx's name
release = version = wsrm_plugin.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "statemachines"]
# the state machines are drawn at build time from their code (docs/_ext/statemachines.py)
graphviz_output_format = "svg"
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# the docstrings are reST with Sphinx roles; the reference documents members in source order
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# the Spark integration needs pyspark and pyarrow (the `spark` extra); the reference does not
autodoc_mock_imports = ["pyspark", "pyarrow"]

html_theme = "alabaster"
html_title = f"wsrm-plugin {release}"
html_static_path: list[str] = []
