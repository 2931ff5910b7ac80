#!/usr/bin/env bash
# The main job on a fresh machine: set up the environments, then the whole on-site story on the
# bundled sample data (tiny student -> adapters trained on recorded teacher outputs -> vLLM + the
# matching API -> sample patients matched over HTTP -> rationales). Extra arguments go to
# `verdict demo` (e.g. --keep-running to leave the service up).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/verdict demo "$@"
