#!/usr/bin/env bash
# The test suite, from nothing but Python: builds the environment, then runs pytest.
# Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# One thread per process: the suite spawns gloo ranks and helper processes on a 2-core machine.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
python -m pytest -q "$@"
