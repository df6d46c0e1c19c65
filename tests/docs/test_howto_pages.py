"""Every Python block of the asyncio and observability pages runs, in order, as one program each.

As the quick start's test does (:mod:`tests.docs.test_quickstart`): the blocks run in a fresh
interpreter in an empty directory, against real servers on loopback; a ``print(...)  # text``
line promises its output, which must appear as a line of the program's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.docs.test_quickstart import FENCE, PROMISE, ROOT, RUNNER

PAGES = ["howto/asyncio.md", "howto/observability.md"]


def blocks_of(page: str) -> list[tuple[int, str]]:
    text = (ROOT / "docs" / page).read_text()
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1)) for match in FENCE.finditer(text)]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_is_made_of_runnable_blocks_that_promise_their_output(page):
    blocks = blocks_of(page)
    assert len(blocks) >= 4
    for line, code in blocks:
        compile(code, f"docs/{page}:{line}", "exec")
    assert len(PROMISE.findall("".join(code for _, code in blocks))) >= 4


@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs_against_real_servers(page, tmp_path):
    blocks = blocks_of(page)
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "runner.py").write_text(RUNNER.replace("docs/quickstart.md", f"docs/{page}"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "runner.py", "blocks.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    assert done.returncode == 0, report
    assert "--- all blocks ran" in done.stdout, report
    output = done.stdout.splitlines()
    for promised in PROMISE.findall("".join(code for _, code in blocks)):
        assert promised in output, f"the page promises {promised!r}\n{report}"
