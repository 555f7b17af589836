#!/usr/bin/env bash
# Create or update the TPU backend's own virtual environment (.venv-tpu): torch 2.9.0 with
# torch-xla 2.9.0 (torch-xla pins the exact torch release it was built against, so it cannot live
# in .venv's torch 2.13), the few runtime/test packages dsahal needs, then dsahal itself in
# editable mode with --no-deps so pip never swaps torch. The torch 2.9.0 wheel on PyPI is the
# CUDA build (it pulls the nvidia-* libraries, ~4 GB); XLA's CPU client (PJRT_DEVICE=CPU) runs
# without a GPU. Sourced by test-tpu.sh; safe to run again (pip skips what is installed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TPU_VENV="${DSAHAL_TPU_VENV:-$ROOT/.venv-tpu}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$TPU_VENV/bin/python" ]; then
    "$PYTHON" -m venv "$TPU_VENV"
fi
"$TPU_VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# torch 2.9.0 and torch-xla 2.9.0 in one resolve so pip cannot pick mismatched releases.
# pip's log goes to a file (this machine's pip config adds local indexes that warn on every
# package) and is printed only when an install fails.
PIP_LOG="$(mktemp)"
trap 'rm -f "$PIP_LOG"' EXIT
pip_quiet() {
    if ! "$TPU_VENV/bin/python" -m pip install -q --progress-bar off "$@" >"$PIP_LOG" 2>&1; then
        cat "$PIP_LOG" >&2
        return 1
    fi
}
pip_quiet "torch==2.9.0" "torch-xla==2.9.0" \
    "pytest>=8" "hypothesis>=6.100" "pluggy>=1.5" "safetensors>=0.4" "numpy>=1.24"
pip_quiet --no-deps -e "$ROOT"
export PATH="$TPU_VENV/bin:$PATH"
