#!/usr/bin/env bash
# Run the test suite (the README's test command; CI calls it too).
# Tests that need a real service (vLLM CPU env, SLURM daemons, Chromium) skip locally when it is
# missing and fail in CI, where VERDICT_REQUIRE_ALL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "run scripts/setup.sh first" >&2; exit 2; }
exec .venv/bin/python -m pytest -q "$@"
