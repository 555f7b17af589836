#!/usr/bin/env bash
# One device session's validation on an NVIDIA GPU, in one call (device time is scarce):
# install the carried pure-Python wheels (.whl/) and dsahal, then
#   1. the conformance suite against `nvidia` (batch-invariant mode, so that claim is tested too),
#   2. the conformance suite against `amd` forced onto its Triton paths ("Triton paths on NVIDIA hardware"),
#   3. the model: `dsahal run --config k31-pro-slice --backend nvidia --check`,
#   4. `dsahal bench` (correctness check before every timing).
# Everything lands in $OUT (the device tool's output folder) or ./gpu-out. Each step has its own
# time limit so one slow step cannot eat the others; a step's failure does not stop the rest.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "commit $COMMIT" | tee "$OUT/meta.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/meta.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/meta.txt"
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name rc=$rc in $((SECONDS - start))s" | tee -a "$OUT/meta.txt"
    tail -n 25 "$OUT/$name.log"
}
MAX_EXAMPLES="${MAX_EXAMPLES:-10}"
step conformance-nvidia "${T_NV:-170}" env DSAHAL_BATCH_INVARIANT=1 python3 -m dsahal conformance --backend nvidia \
    --seed 1 --max-examples "$MAX_EXAMPLES" --report-dir "$OUT/conformance-nvidia"
step conformance-amd "${T_AMD:-110}" env DSAHAL_AMD_PATHS=triton DSAHAL_BATCH_INVARIANT=1 python3 -m dsahal conformance \
    --backend amd --seed 1 --max-examples "$MAX_EXAMPLES" --report-dir "$OUT/conformance-amd"
step run-k31-slice "${T_RUN:-70}" python3 -m dsahal run --config k31-pro-slice --backend nvidia --batch 4 \
    --prompt-len 512 --decode 8 --check --json "$OUT/run-k31-slice.json"
step bench "${T_BENCH:-120}" python3 -m dsahal bench --backend nvidia --json "$OUT/bench.json"
