"""How long the README's test command takes on N workers, from measured test durations.

The suite's duration is a schedule: whole files go to 4 workers (``--dist loadfile``), the
longest first by their ``@pytest.mark.slow(minutes=...)`` marks (``tests/conftest.py``).  This
replays xdist's scheduling with each test's measured duration and lists the longest files with
their place in the order, so the marks can be checked and the effect of a change (a file split,
a shorter wait, another worker count) estimated without running the whole suite again::

    .venv/bin/python -m pytest --collect-only -q > order.txt          # the order the marks give
    .venv/bin/python -m pytest ... --junitxml=a.xml tests/x/test_y.py  # durations, any number of files
    .venv/bin/python scripts/suite_schedule.py --order order.txt a.xml b.xml [--default 0.3]

A test with no measured duration counts ``--default`` seconds.  The replay knows nothing of the
machine's load (each worker runs as if alone: tests that sleep cost as much as tests that
compute): it says what the order costs, not what the machine will do.
"""

from __future__ import annotations

import argparse
import heapq
import logging
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("suite_schedule")
ROOT = Path(__file__).resolve().parents[1]


def nodeid_of(classname: str, name: str) -> str:
    """A junit ``testcase``'s pytest node id (``tests.a.test_b.TestC`` + ``t`` -> ``tests/a/test_b.py::TestC::t``)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (ROOT / path).exists():
            return "::".join([path, *parts[cut:], name])
    return "::".join(["/".join(parts) + ".py", name])


def durations(paths: list[str]) -> dict[str, float]:
    """Seconds of each test (its setup, call and teardown) in the junit files."""
    found: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            found[nodeid_of(case.get("classname", ""), case.get("name", ""))] = float(case.get("time", 0))
    return found


def replay(files: OrderedDict[str, list[float]], workers: int) -> tuple[float, list[list[str]]]:
    """(makespan, the files each worker ran) under xdist's ``loadfile`` rules: a worker is sent the
    next file in line whenever it has two tests or fewer left (it runs a test only once it knows
    the next one), so a one-test file always has the next file waiting behind it."""
    queue = OrderedDict(files)
    pending: list[list[float]] = [[] for _ in range(workers)]
    ran: list[list[str]] = [[] for _ in range(workers)]

    def assign(w: int) -> None:
        if queue:
            name, tests = queue.popitem(last=False)
            pending[w].extend(tests)
            ran[w].append(name)

    for w in range(workers):
        assign(w)
    for w in range(workers):
        if len(pending[w]) <= 2:
            assign(w)
    clock = [0.0] * workers
    events = [(pending[w][0], w) for w in range(workers) if pending[w]]
    heapq.heapify(events)
    while events:
        at, w = heapq.heappop(events)
        clock[w] = at
        pending[w].pop(0)
        if len(pending[w]) <= 2:
            assign(w)
        if pending[w]:
            heapq.heappush(events, (at + pending[w][0], w))
    return max(clock), ran


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("junit", nargs="+", help="junit xml files (pytest --junitxml) with measured durations")
    parser.add_argument("--order", required=True, help="`pytest --collect-only -q` output: the tests in their order")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--default", type=float, default=0.3, help="seconds of a test not measured")
    args = parser.parse_args()
    measured = durations(args.junit)
    files: OrderedDict[str, list[float]] = OrderedDict()
    missing = 0
    for line in Path(args.order).read_text().splitlines():
        if "::" not in line:
            continue
        seconds = measured.get(line)
        missing += seconds is None
        files.setdefault(line.split("::")[0], []).append(args.default if seconds is None else seconds)
    total = sum(sum(tests) for tests in files.values())
    log.info("%d files, %d tests (%d not measured, %.1f s each): %.0f s of work, %.0f s a worker at best",
             len(files), sum(map(len, files.values())), missing, args.default, total, total / args.workers)
    makespan, ran = replay(files, args.workers)
    log.info("xdist's loadfile on %d workers: %.0f s", args.workers, makespan)
    for w, names in enumerate(ran):
        log.info("  worker %d: %.0f s, %s", w, sum(sum(files[name]) for name in names),
                 ", ".join(f"{Path(n).name} {sum(files[n]):.0f}" for n in names if sum(files[n]) >= 20))
    log.info("files of 20 s or more, longest first (the order's position in brackets):")
    position = {name: i for i, name in enumerate(files)}
    for name in sorted(files, key=lambda n: -sum(files[n])):
        if sum(files[name]) >= 20:
            log.info("  %6.0f s  [%3d] %s (%d tests)", sum(files[name]), position[name], name, len(files[name]))


if __name__ == "__main__":
    main()
