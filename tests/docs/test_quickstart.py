"""Every Python block of the quick start runs, in order, as the one program the page describes.

The blocks are taken from ``docs/quickstart.md`` as written, run in a fresh
interpreter in an empty directory (the SQLite files land there) against real
servers on loopback and two real PostgreSQL databases (``CLIENT_DSN`` and
``SERVICE_DSN``, as the page asks).  A ``print(...)  # text`` line promises
its output: each such text must appear in the program's output.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PROMISE = re.compile(r"^\s*print\(.*\)\s+#\s*(\S.*?)\s*$", re.M)

RUNNER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for index, (line, code) in enumerate(blocks, 1):
    print(f"--- block {index} (docs/quickstart.md line {line})", flush=True)
    exec(compile("\\n" * (line - 1) + code, "docs/quickstart.md", "exec"), namespace)
print("--- all blocks ran", flush=True)
"""


def quickstart_blocks() -> list[tuple[int, str]]:
    text = PAGE.read_text()
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1)) for match in FENCE.finditer(text)]


def test_the_page_is_made_of_runnable_blocks():
    blocks = quickstart_blocks()
    assert len(blocks) >= 8
    for line, code in blocks:
        compile(code, f"docs/quickstart.md:{line}", "exec")  # a syntax error names its line
    assert len(PROMISE.findall("".join(code for _, code in blocks))) >= 4


@pytest.mark.postgres
def test_every_quickstart_block_runs_against_real_servers(tmp_path, pg_dsn_factory):
    blocks = quickstart_blocks()
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "CLIENT_DSN": pg_dsn_factory("qs_client"), "SERVICE_DSN": pg_dsn_factory("qs_service")}
    done = subprocess.run([sys.executable, "runner.py", "blocks.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    assert done.stdout.count("--- block ") == len(blocks), report
    assert "--- all blocks ran" in done.stdout, report
    output = done.stdout.splitlines()
    for promised in PROMISE.findall("".join(code for _, code in blocks)):
        assert promised in output, f"the page promises {promised!r}\n{report}"
    assert (tmp_path / "client-rm.db").exists() and (tmp_path / "service-rm.db").exists()
