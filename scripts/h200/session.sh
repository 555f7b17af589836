#!/usr/bin/env bash
# One device call on an H200: install the carried wheels and dsahal, then the steps named on the command
# line, each under its own time limit, logs in $OUT. Steps: backends dispatch routes mla fp4 flacfg model bench
# bench_noflashmla (the carried wheels off the path) firstrun run conformance conformance2 (both modes side by side),
# and py:NAME[:SECONDS] for scripts/h200/NAME.py (its arguments in $ARGS_NAME).
set -uo pipefail
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
{ echo "commit $(cat .device-commit 2>/dev/null || echo unknown)"; date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/meta.txt"
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2; local start=$SECONDS
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
    echo "=== $name rc=$rc in $((SECONDS - start))s" | tee -a "$OUT/meta.txt"; tail -n "${TAIL:-40}" "$OUT/$name.log"
}
for s in "$@"; do case "$s" in
  backends) step backends 60 dsahal backends -v ;;
  dispatch) step dispatch 90 env DSAHAL_BACKEND=nvidia python3 -m dsahal.bench.dispatch ;;
  routes) step routes "${T_ROUTES:-300}" python3 scripts/h200/routes_check.py ${ROUTES_ARGS:-} ;;
  mla) step mla "${T_MLA:-200}" python3 scripts/h200/sparse_mla_bench.py ${MLA_ARGS:---no-sweep} ;;
  fp4) step fp4 120 python3 scripts/h200/fp4_check.py ;;
  flacfg) step flacfg "${T_FLACFG:-300}" python3 scripts/h200/fla_configs.py ;;
  model) step model "${T_MODEL:-200}" dsahal bench --backend nvidia --op model ${MODEL_ARGS:-} ;;
  bench) step bench "${T_BENCH:-400}" dsahal bench --backend nvidia ${BENCH_ARGS:-} --json "$OUT/bench.json" ;;
  bench_noflashmla) step bench_noflashmla "${T_BENCH:-400}" env -u PYTHONPATH dsahal bench --backend nvidia ${BENCH_ARGS:-} \
       --json "$OUT/bench_noflashmla.json" ;;  # the carried wheels off the path: FlashMLA and fla absent
  firstrun) for mode in ${FIRSTRUN_MODES:-warm}; do rm -rf /tmp/fresh-triton-cache  # empty cache (a warm machine keeps /tmp)
       TAIL=30 step "firstrun_$mode" 200 env TRITON_CACHE_DIR=/tmp/fresh-triton-cache dsahal run --config k31-pro-slice \
         --backend nvidia $([ "$mode" = cold ] && echo --no-warmup) --json "$OUT/firstrun_$mode.json" ${RUN_ARGS:-}; done ;;
  run) TAIL=30 step run_eager 150 env DSAHAL_ROUTES=kda_prefill:triton_recurrent dsahal run --config k31-pro-slice --backend nvidia --batch 64 --prompt-len 4096 --decode 16 ${RUN_ARGS:-}
       TAIL=30 step run_graph 150 env DSAHAL_ROUTES=kda_prefill:triton_recurrent dsahal run --config k31-pro-slice --backend nvidia --batch 64 --prompt-len 4096 --decode 16 --cuda-graph ${RUN_ARGS:-} ;;
  conformance) step conformance "${T_CONF:-300}" dsahal conformance --backend nvidia ${CONF_ARGS:-} --report-dir "$OUT/conf" ;;
  conformance2) TAIL=20 step conformance2 "${T_CONF:-420}" bash scripts/h200/conformance_both.sh ${CONF_ARGS:-} ;;  # both modes
  py:*) n=${s#py:}; lim=${n#*:}; n=${n%%:*}; [ "$lim" = "$n" ] && lim=150; args_var="ARGS_$n"
        # py:NAME[:SECONDS]: scripts/h200/NAME.py, with the words of $ARGS_NAME (e.g. ARGS_topk_sweep=--prefill)
        step "$n" "$lim" python3 "scripts/h200/$n.py" ${!args_var:-} ;;
  *) echo "unknown step $s" ;;
esac; done
