#!/usr/bin/env bash
# The TPU backend's CI job (part 2 of scripts/test.sh), on XLA's CPU client (PJRT_DEVICE=CPU): builds
# .venv-tpu (torch 2.9.0 + torch-xla 2.9.0, about 7 GB), runs the backend's own tests (tests_tpu/),
# then the conformance suite against `tpu` with DSAHAL_STRICT=1, so any op served by the reference
# fallback fails the run. This verifies the XLA formulations on XLA:CPU, not on a TPU.
# Arguments go to the tests_tpu pytest run (e.g. -k compile). DSAHAL_TPU_EXAMPLES sets the
# conformance budget (hypothesis examples per property; each new shape is one XLA compilation).
set -euo pipefail
start=$SECONDS
echo "== part 2/2: the TPU backend job (tests_tpu/ and conformance --backend tpu on XLA:CPU, .venv-tpu)"
source "$(dirname "${BASH_SOURCE[0]}")/tpu-env.sh"
cd "$ROOT"
export PJRT_DEVICE=CPU
unset DSAHAL_BACKEND DSAHAL_PLUGINS
echo "-- tests_tpu/${*:+ (arguments: $*)}"
python -m pytest -q -p no:cacheprovider tests_tpu "$@"
EXAMPLES="${DSAHAL_TPU_EXAMPLES:-2}"
# 1. Arguments on the XLA device (the suite's default for an xla-tagged backend), minus the few
#    properties torch-xla cannot host (see the skips file for why)...
echo "-- conformance --backend tpu --device xla ($EXAMPLES examples per property)"
DSAHAL_STRICT=1 dsahal conformance --backend tpu --device xla --max-examples "$EXAMPLES" --seed 0 \
    --skips backends/tpu/conformance-skips-xla.txt --report-dir "$ROOT/reports/conformance-tpu"
# 2. ...and those with host arguments, staged through the XLA device by the backend.
echo "-- conformance --backend tpu --device cpu (host arguments staged through XLA)"
DSAHAL_STRICT=1 dsahal conformance --backend tpu --device cpu --max-examples "$EXAMPLES" --seed 0 \
    -k "test_cache_write_then_read or test_cache_write_touches_nothing or test_kda_decode_rejects_bad_input or test_kda_decode_matches_reference or test_kda_prefill_matches_reference or test_kda_prefill_of_whole_chunks" \
    --report-dir "$ROOT/reports/conformance-tpu-host"
echo "== part 2/2 passed in $((SECONDS - start)) s"
