"""The drawings of the state machines are computed from their transition functions.

The concepts page draws every machine at build time from
:mod:`wsrm_plugin.statemachine.diagram`; these tests hold that the drawing
shows exactly what the code allows: a node per valid state, an arrow per
effective allowed transition, none for a refused or a no-op event.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from enum import Enum

import pytest

from wsrm_plugin.statemachine import InvalidTransition, Reason, Transition
from wsrm_plugin.statemachine.diagram import Machine, edges, machine, to_dot

NAMES = ("rms", "rmd", "invoker", "peer", "lane", "delivery", "outage")


@pytest.mark.parametrize("name", NAMES)
def test_every_allowed_effective_transition_is_an_arrow_and_nothing_else(name):
    m = machine(name)
    expected = set()
    for state in m.states():
        for event in m.events():
            try:
                result = m.transition(state, event)
            except InvalidTransition:
                continue
            if not result.noop:
                expected.add((state, event, result.state))
    drawn = {(e.source, event, e.target) for e in edges(m) for event in e.events}
    assert drawn == expected
    assert expected, f"{name} has no transition at all"


@pytest.mark.parametrize("name", NAMES)
def test_the_dot_text_has_a_node_per_valid_state_and_an_edge_per_arrow(name):
    m = machine(name)
    dot = to_dot(m)
    labels = re.findall(r'^  s\d+ \[label="([^"]*)"\];$', dot, re.M)
    assert sorted(labels) == sorted(m.label(s) for s in m.states())
    assert len(re.findall(r"^  s\d+ -> s\d+ ", dot, re.M)) == len(edges(m))
    assert len(re.findall(r"^  start\d+ -> ", dot, re.M)) == len(list(m.initial()))


class _Event(Enum):
    GO = "go"
    STAY = "stay"
    NO = "refused"


def test_a_changed_rule_changes_the_drawing():
    # a two-state machine whose rule is a parameter: the drawing follows it
    def machine_with(rule):
        return Machine("toy", "toy", lambda: ("a", "b"), lambda: _Event, rule, lambda: ("a",),
                       label=lambda s: s.upper())

    def allows_go(state, event):
        if event is _Event.NO:
            raise InvalidTransition(state, event, Reason.UNEXPECTED)
        if event is _Event.STAY:
            return Transition(state, state)
        return Transition(state, "b" if state == "a" else "a")

    def refuses_go_back(state, event):
        if event is _Event.GO and state == "b":
            raise InvalidTransition(state, event, Reason.UNEXPECTED)
        return allows_go(state, event)

    both = {(e.source, e.target) for e in edges(machine_with(allows_go))}
    one = {(e.source, e.target) for e in edges(machine_with(refuses_go_back))}
    assert both == {("a", "b"), ("b", "a")}
    assert one == {("a", "b")}


def test_an_unknown_machine_is_named_in_the_error():
    with pytest.raises(KeyError, match="no state machine called 'nope'.*rms"):
        machine("nope")


@pytest.mark.parametrize("name", NAMES)
def test_graphviz_renders_each_machine(name):
    # Graphviz comes from Debian (scripts/bootstrap.sh installs it); the docs need it too
    assert shutil.which("dot"), "Graphviz's dot is missing: run scripts/bootstrap.sh"
    done = subprocess.run(["dot", "-Tsvg"], input=to_dot(machine(name)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "<svg" in done.stdout
