#!/usr/bin/env bash
# The main job on embedded defaults, on a fresh machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh
exec .venv/bin/wsrm demo "$@"
