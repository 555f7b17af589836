#!/usr/bin/env bash
# Create or update the TPU backend's own virtual environment (.venv-tpu): torch 2.9.0 with
# torch-xla 2.9.0 (torch-xla pins the exact torch release it was built against, so it cannot live
# in .venv's torch 2.13), the few runtime/test packages dsahal needs, then dsahal itself in
# editable mode with --no-deps so pip never swaps torch. The torch 2.9.0 wheel on PyPI is the
# CUDA build (it pulls the nvidia-* libraries: the whole .venv-tpu is about 7 GB); XLA's CPU client
# (PJRT_DEVICE=CPU) runs without a GPU. Sourced by test-tpu.sh; safe to run again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TPU_VENV="${DSAHAL_TPU_VENV:-$ROOT/.venv-tpu}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$TPU_VENV/bin/python" ]; then
    "$PYTHON" -m venv "$TPU_VENV"
fi
source "$ROOT/scripts/pip-quiet.sh"
# pip's log goes to a file (this machine's pip config adds local indexes that warn on every package)
# and is printed only when an install fails; pip runs only when the venv is new or pyproject.toml,
# setup.py or this script changed since the last install (.venv-tpu/.dsahal-dsahal-tpu.stamp).
_tpu_pip_steps() {  # run inside `if`, where set -e does not apply: each step returns on failure
    "$TPU_VENV/bin/python" -m pip install -q --upgrade pip || true  # an old pip still installs; not fatal
    # torch 2.9.0 and torch-xla 2.9.0 in one resolve so pip cannot pick mismatched releases. 3.9 GiB of
    # wheels from PyPI (the CUDA build's nvidia-* wheels), 7.1 GiB installed: installed one wheel at a time
    # without pip's cache, so the disk never holds the wheels beside the installed set (pip-quiet.sh).
    install_one_wheel_at_a_time "$TPU_VENV/bin/python" "torch==2.9.0" "torch-xla==2.9.0" \
        "pytest>=8" "hypothesis>=6.100" "pluggy>=1.5" "safetensors>=0.4" "numpy>=1.24" || return
    "$TPU_VENV/bin/python" -m pip install -q --progress-bar off --no-deps -e "$ROOT" || return
}
install_if_changed "$TPU_VENV" dsahal-tpu "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/scripts/tpu-env.sh" \
    -- _tpu_pip_steps
export PATH="$TPU_VENV/bin:$PATH"
