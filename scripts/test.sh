#!/usr/bin/env bash
# The test suite, from nothing but Python: builds the environment, runs pytest (extra arguments go
# to pytest), then the TPU backend's job on XLA's CPU client in its own environment
# (scripts/test-tpu.sh: torch 2.9.0 + torch-xla 2.9.0). DSAHAL_SKIP_TPU=1 skips the latter.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# One thread per process: the suite spawns gloo ranks and helper processes on a 2-core machine.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m pytest -q "$@"
if [ "${DSAHAL_SKIP_TPU:-0}" != "1" ]; then
    "$ROOT/scripts/test-tpu.sh"
fi
