#!/usr/bin/env bash
# Nsight Compute on hot_ncu.py's indexer cases (the block-tile kernel's third launch of each case): one report a
# case in $OUT/ncu-<case>.txt with the speed-of-light, occupancy, launch and warp-state sections, every stall reason
# per issued instruction and every pipe's utilisation; the lines that say where the time goes printed here.
#   OUT=... bash scripts/h200/ncu_indexer.sh indexer2 indexer5 indexer_bf16
set -uo pipefail
OUT="${OUT:?set OUT}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$NCU" ] || { echo "error: ncu not found"; exit 1; }
for case in "$@"; do
    timeout "${T_NCU_CASE:-150}" "$NCU" --clock-control none -k regex:indexer_tiles --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*_per_cycle_active\.pct" \
        python3 scripts/h200/hot_ncu.py "$case" >"$OUT/ncu-$case.txt" 2>&1
    echo "=== $case rc=$?"
    grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|==ERR|error" "$OUT/ncu-$case.txt" | head -20
    grep -E "stalled_.*ratio|pipe_.*pct" "$OUT/ncu-$case.txt" | grep -vE " 0(\.0+)?$" | head -40
done
