#!/usr/bin/env bash
# The whole test suite, slow fault-injection runs included, on a fresh machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WSRM_EXTRAS="${WSRM_EXTRAS:-test,spark}" scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
