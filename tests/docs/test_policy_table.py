"""The knobs table of ``docs/policy.md`` is checked against :class:`RMPolicy`: a new knob without a
row, a row for a knob that is gone, or a default that changed without the table fails here.

The table is rendered from the fields' declarations (``scripts/policy_table.py`` rewrites it); the
first test holds the page to that rendering, the others say what the rendering must get right."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from wsrm_plugin import AckRequestMode, DeliveryAssurance, RMPolicy
from wsrm_plugin.engine.knobs import markdown_table
from wsrm_plugin.wire import RM10, RM11, SOAP11, SOAP12

PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "policy.md"
ROW = re.compile(r"^\| `(\w+)` \| `(.+?)` \|(.*)\|\s*$", re.M)


def rows() -> dict[str, tuple[str, list[str]]]:
    found: dict[str, tuple[str, list[str]]] = {}
    for match in ROW.finditer(PAGE.read_text()):
        name, default, rest = match.groups()
        assert name not in found, f"{name} has two rows"
        found[name] = (default.replace("\\|", "|"), [c.strip() for c in rest.split("|")])
    return found


def test_the_table_is_rendered_from_the_declarations():
    import importlib.util

    spec = importlib.util.spec_from_file_location("policy_table", PAGE.parents[1] / "scripts" / "policy_table.py")
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    page = PAGE.read_text()
    assert script.with_table(page, markdown_table(RMPolicy)) == page, \
        "docs/policy.md's table differs from RMPolicy's declarations: run .venv/bin/python scripts/policy_table.py"


def test_every_knob_has_exactly_one_row_and_no_row_is_stale():
    fields = [f.name for f in dataclasses.fields(RMPolicy) if f.init]
    assert sorted(rows()) == sorted(fields)


def test_the_documented_defaults_are_the_real_ones():
    scope = {"DeliveryAssurance": DeliveryAssurance, "AckRequestMode": AckRequestMode,
             "RM10": RM10, "RM11": RM11, "SOAP11": SOAP11, "SOAP12": SOAP12}
    defaults = {f.name: f.default for f in dataclasses.fields(RMPolicy)}
    for name, (default, _) in rows().items():
        assert eval(default, scope) == defaults[name], f"{name}: the page says {default}"  # noqa: S307


def test_every_row_says_what_the_knob_does_and_names_cxf_and_wcf():
    for name, (_, cells) in rows().items():
        what, _wsdl, cxf, wcf = cells
        assert len(what) > 15, name
        assert cxf and wcf, f"{name}: the CXF and WCF columns need a name or a dash"


def test_the_knobs_read_from_the_wsdl_are_the_ones_the_reader_sets():
    from interceptors.policy_reader import PublishedRMPolicy

    marked = {name for name, (_, cells) in rows().items() if cells[1]}
    readable = {f.name for f in dataclasses.fields(PublishedRMPolicy)} - {"in_order"}
    assert marked == readable
