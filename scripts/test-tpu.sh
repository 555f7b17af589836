#!/usr/bin/env bash
# The TPU backend's CI job, on XLA's CPU client (PJRT_DEVICE=CPU): builds .venv-tpu (torch 2.9.0 +
# torch-xla 2.9.0), runs the backend's own tests (tests_tpu/), then the conformance suite against
# `tpu` with DSAHAL_STRICT=1, so any op served by the reference fallback fails the run.
# This verifies the XLA formulations on XLA:CPU, not on a TPU.
# Extra arguments go to the tests_tpu pytest run. DSAHAL_TPU_EXAMPLES sets the conformance budget.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tpu-env.sh"
cd "$ROOT"
export PJRT_DEVICE=CPU
unset DSAHAL_BACKEND DSAHAL_PLUGINS
python -m pytest -q -p no:cacheprovider tests_tpu "$@"
DSAHAL_STRICT=1 dsahal conformance --backend tpu --max-examples "${DSAHAL_TPU_EXAMPLES:-3}" --seed 0 \
    --report-dir "$ROOT/reports/conformance-tpu"
