#!/usr/bin/env bash
# Both conformance modes of the nvidia backend side by side on the one GPU (the default mode and
# DSAHAL_BATCH_INVARIANT=1), each with its own report folder under $OUT (conf/, conf-inv/) and log; then the
# two reports packed into $OUT/conf.tgz (the per-part folders dropped) and copied flat ($OUT/conf.md, conf.json,
# conf-inv.md, conf-inv.json), their summaries printed. Arguments go to
# both `dsahal conformance` runs (e.g. --ops sparse_mla dsa_attention --max-examples 60 -j 8). A route is
# forced with DSAHAL_ROUTES in the environment (e.g. sparse_mla:gluon_few_heads), which both runs inherit.
# Run through session.sh: `CONF_ARGS="--ops sparse_mla" bash scripts/h200/session.sh conformance2`.
set -uo pipefail
OUT="${OUT:?set OUT}"
echo "DSAHAL_ROUTES=${DSAHAL_ROUTES:-}  arguments: $*"
(dsahal conformance --backend nvidia "$@" --report-dir "$OUT/conf" >"$OUT/conf.log" 2>&1; echo "default rc=$?" >>"$OUT/conf.log") &
(DSAHAL_BATCH_INVARIANT=1 dsahal conformance --backend nvidia "$@" --report-dir "$OUT/conf-inv" >"$OUT/conf-inv.log" 2>&1
 echo "batch-invariant rc=$?" >>"$OUT/conf-inv.log") &
wait
for mode in conf conf-inv; do echo "--- $mode"; tail -n 8 "$OUT/$mode.log"; done
# the two reports also flat beside the archive (conf.md, conf.json, conf-inv.md, conf-inv.json): a device call returns
# only a few files, and a loop over forced routes (OUT per route) then needs no second call to unpack them
cd "$OUT" && rm -rf conf/parts conf-inv/parts && tar czf conf.tgz conf conf-inv \
    && for mode in conf conf-inv; do for ext in md json; do
           [ -f "$mode/conformance.$ext" ] && cp "$mode/conformance.$ext" "$mode.$ext"; done; done \
    && rm -rf conf conf-inv
grep -q "default rc=0" conf.log && grep -q "batch-invariant rc=0" conf-inv.log
