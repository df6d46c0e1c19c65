"""Rewrite the knobs table of docs/policy.md from RMPolicy's declarations.

    .venv/bin/python scripts/policy_table.py          # rewrite the page
    .venv/bin/python scripts/policy_table.py --check  # exit 1 if the page differs

The table is the rows :func:`wsrm_plugin.engine.knobs.markdown_table` renders;
tests/docs/test_policy_table.py fails while the page and the declarations differ.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wsrm_plugin.engine.knobs import markdown_table  # noqa: E402 -- after the path is set
from wsrm_plugin.engine.policy import RMPolicy  # noqa: E402

PAGE = ROOT / "docs" / "policy.md"
HEADER = "| knob | default |"


def with_table(page: str, table: str) -> str:
    """``page`` with its knobs table (from its header row to the first line that is not a row) replaced."""
    lines = page.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "".join(lines[:start]) + table + "".join(lines[end:])


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    wanted = with_table(page, markdown_table(RMPolicy))
    if "--check" in argv:
        return 0 if wanted == page else 1
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
