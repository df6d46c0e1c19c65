#!/usr/bin/env bash
# The whole test suite, slow fault-injection runs included, on a fresh machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WSRM_EXTRAS="${WSRM_EXTRAS:-test,spark}" scripts/bootstrap.sh
# Four worker processes (pytest-xdist), a test file to each: most tests wait on networks,
# processes and timers, so four share the 2 cores well (three took 1344-1353 s on this 2-core
# machine, over the guide's 20 minutes; scripts/suite_schedule.py estimates about 960 s for four).  WSRM_TEST_WORKERS=0 runs them in one
# process; an -n in the arguments wins over this one.  The files go out longest first (see
# pytest_collection_modifyitems in tests/conftest.py), which xdist keeps with --no-loadscope-reorder.
exec .venv/bin/python -m pytest -n "${WSRM_TEST_WORKERS:-4}" --dist loadfile --no-loadscope-reorder "$@"
