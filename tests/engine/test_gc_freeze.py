"""``RMPolicy.freeze_gc_at_start``: the start-up objects leave the collector's sight, once per process.

Each case runs in a fresh interpreter: the test process's own collector state
(earlier tests' engines froze it) says nothing about a real process's start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import gc, json, sys
    from wsrm_plugin.engine.engine import ReliableEngine
    from wsrm_plugin.engine.policy import RMPolicy

    freeze = sys.argv[1] == "on"
    out = {"before": gc.get_freeze_count()}
    garbage = []
    garbage.append(garbage)  # a cycle nothing refers to: collected before the freeze, not frozen
    del garbage
    first = ReliableEngine("memory:", RMPolicy(freeze_gc_at_start=freeze), name="first").start()
    out["after_first"] = gc.get_freeze_count()
    made_later = [[i] for i in range(5000)]  # the application's objects after the first start
    assert made_later
    second = ReliableEngine("memory:", RMPolicy(freeze_gc_at_start=freeze), name="second").start()
    out["after_second"] = gc.get_freeze_count()
    first.stop(timeout=2)
    second.stop(timeout=2)
    print(json.dumps(out))
""")


def _run(mode: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, mode], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_first_start_freezes_the_objects_alive_then_and_a_second_start_adds_none() -> None:
    out = _run("on")
    assert out["before"] == 0
    # the interpreter, the engine's modules and the engine: thousands of objects
    assert out["after_first"] > 10_000
    # the 5000 lists made after the first start stay in the collector's sight
    assert out["after_second"] == out["after_first"]


def test_off_leaves_the_collector_as_it_is() -> None:
    out = _run("off")
    assert out == {"before": 0, "after_first": 0, "after_second": 0}
