#!/usr/bin/env bash
# Validation on an NVIDIA GPU in few calls (device time is scarce). Usage:
#   scripts/gpu-validate.sh STEP...      STEP: tune | run | conformance | bench | profile | multigpu
# Installs the carried pure-Python wheels (.whl/) and dsahal, then runs the steps in order:
#   tune         block-size sweep of the shared Triton kernels (python -m dsahal.backends.nvidia.tune)
#   run          the model: `dsahal run --config k31-pro-slice --backend nvidia --check`, eager and with
#                its decode steps replayed from CUDA graphs
#   conformance  three suites at once, each split over processes (`--jobs`): `nvidia` (default mode),
#                `nvidia` in batch-invariant mode (proves that claim), `amd` forced onto its Triton
#                paths ("Triton paths on NVIDIA hardware")
#   bench        `dsahal bench --backend nvidia` (correctness check before every timing; BENCH_OPS="--op A
#                --op B" picks ops, in that order)
#   profile      Nsight Compute counters (speed of light, memory, warp stalls, occupancy) of the PERF.md
#                targets' kernels: `ncu ... python -m dsahal.bench.profile --targets`
#   multigpu     `torchrun -m dsahal.bench.multi_gpu` over every GPU (NCCL, NVLink multicast off):
#                KV capacity DCP vs TP, exact vs generic merge, token- vs head-sharded prefill
#                (MULTI_GPU_ARGS adds arguments, e.g. "--section merge --prefill-lengths 8192")
# The device machine's copy of the repository keeps the session's first commit as HEAD: write the commit
# under test first (`git rev-parse --short HEAD > .device-commit`, ignored through .gitignore,
# carried with `.whl`) so meta.txt names it.
# Everything lands in $OUT (the device tool's output folder) or ./gpu-out. Each step has its own
# time limit (T_<STEP> seconds) so one slow step cannot eat the others; a failing step does not stop
# the rest.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if [ -f .device-commit ]; then
    COMMIT="$(cat .device-commit) (as written before the call)"
else
    COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown) (the machine's copy; may predate the tree)"
fi
{ echo "commit $COMMIT, working tree $(git status --porcelain 2>/dev/null | wc -l) changed paths"; date -u;
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/meta.txt"

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name rc=$rc in $((SECONDS - start))s" | tee -a "$OUT/meta.txt"
    tail -n "${TAIL:-25}" "$OUT/$name.log"
}

conformance() {  # three suites concurrently; JOBS processes each
    local jobs="${JOBS:-5}" examples="${MAX_EXAMPLES:-10}" limit="${T_CONFORMANCE:-540}"
    local common=(--seed 1 --max-examples "$examples")
    # With two or more GPUs the default-mode suite gets a GPU of its own and the other two share the next
    # (the suites are compile-bound; a GPU each still keeps their kernels from queueing behind each other).
    local ngpu gpu_nv="" gpu_other=""
    ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 1)
    if [ "${ngpu:-1}" -ge 2 ]; then gpu_nv=0; gpu_other=1; fi
    # NV_OPS, NV_INV_OPS, AMD_OPS: op families per suite (default all); JOBS_NV, JOBS_INV, JOBS_AMD: processes
    timeout "$limit" env ${gpu_nv:+CUDA_VISIBLE_DEVICES=$gpu_nv} python3 -m dsahal conformance --backend nvidia \
        "${common[@]}" --jobs "${JOBS_NV:-$jobs}" \
        ${NV_OPS:+--ops $NV_OPS} --report-dir "$OUT/conformance-nvidia" >"$OUT/conformance-nvidia.log" 2>&1 &
    timeout "$limit" env ${gpu_other:+CUDA_VISIBLE_DEVICES=$gpu_other} DSAHAL_BATCH_INVARIANT=1 python3 -m dsahal conformance --backend nvidia "${common[@]}" \
        --jobs "${JOBS_INV:-$jobs}" ${NV_INV_OPS:+--ops $NV_INV_OPS} \
        --report-dir "$OUT/conformance-nvidia-invariant" >"$OUT/conformance-nvidia-invariant.log" 2>&1 &
    timeout "$limit" env ${gpu_other:+CUDA_VISIBLE_DEVICES=$gpu_other} DSAHAL_AMD_PATHS=triton python3 -m dsahal conformance --backend amd "${common[@]}" \
        --jobs "${JOBS_AMD:-$jobs}" ${AMD_OPS:+--ops $AMD_OPS} \
        --report-dir "$OUT/conformance-amd-triton" >"$OUT/conformance-amd-triton.log" 2>&1 &
    if [ -n "${WITH_RUN:-}" ]; then  # the model run alongside (a correctness check; its timings are disturbed)
        ( run_model ) >"$OUT/run-alongside.log" 2>&1 &
    fi
    local start=$SECONDS
    wait
    echo "=== conformance (3 suites x $jobs jobs, $examples examples) done in $((SECONDS - start))s" | tee -a "$OUT/meta.txt"
    for suite in nvidia nvidia-invariant amd-triton; do
        echo "--- $suite"; tail -n 15 "$OUT/conformance-$suite.log"
    done
    pack conformance
}

pack() {  # the device tool returns a limited number of files: fold report folders into one archive
    (cd "$OUT" && tar czf "$1-reports.tgz" conformance-*/ 2>/dev/null && rm -rf conformance-*/)
}

run_model() {  # the model eager, then with decode steps replayed from CUDA graphs, each checked against the reference
    step run-k31-slice "${T_RUN:-150}" python3 -m dsahal run --config k31-pro-slice --backend nvidia \
        --batch 8 --prompt-len 512 --decode 16 --check --progress --json "$OUT/run-k31-slice.json"
    step run-k31-slice-graph "${T_RUN:-150}" python3 -m dsahal run --config k31-pro-slice --backend nvidia \
        --batch 8 --prompt-len 512 --decode 16 --check --progress --cuda-graph --json "$OUT/run-k31-slice-graph.json"
}

for what in "$@"; do
    case "$what" in
        tune) TAIL=400 step tune "${T_TUNE:-300}" python3 -m dsahal.backends.nvidia.tune ${TUNE_SECTIONS:-} ;;
        run) run_model ;;
        conformance) conformance ;;
        bench) TAIL=60 step bench "${T_BENCH:-420}" python3 -m dsahal bench --backend nvidia --json "$OUT/bench.json" \
                   --plot "$OUT/roofline.png" ${BENCH_OPS:-} ;;
        profile) TAIL=400 step profile "${T_PROFILE:-240}" ncu --clock-control none --profile-from-start off \
                     --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
                     --section Occupancy --section LaunchStats python3 -m dsahal.bench.profile ${PROFILE_ARGS:---targets} ;;
        multigpu) TAIL=80 step multigpu "${T_MULTIGPU:-420}" env NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
                      NVSHMEM_DISABLE_NVLS=1 DSAHAL_BACKEND=nvidia python3 -m torch.distributed.run --nproc-per-node \
                      "$(python3 -c 'import torch; print(torch.cuda.device_count())')" -m dsahal.bench.multi_gpu \
                      --json "$OUT/multi_gpu.json" ${MULTI_GPU_ARGS:-} ;;
        *) echo "unknown step $what (tune | run | conformance | bench | profile | multigpu)"; exit 2 ;;
    esac
done
