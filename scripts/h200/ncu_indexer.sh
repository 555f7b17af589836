#!/usr/bin/env bash
# Nsight Compute on hot_ncu.py's indexer cases (the block-tile kernel's third launch of each case): one report a
# case in $OUT/ncu-<case>.txt (packed into $OUT/ncu.tgz at the end) with the speed-of-light, occupancy, launch, warp-state, compute, memory and instruction
# sections and every stall reason per issued instruction; the lines that say where the time goes printed here.
#   OUT=... bash scripts/h200/ncu_indexer.sh indexer2 indexer5 indexer_bf16
# NCU_KERNEL: the kernel's name pattern (default indexer_tiles, the tl block tiles; indexer_gluon for the Gluon kernel,
# which the backend runs at <= 2 tokens a request).
set -uo pipefail
OUT="${OUT:?set OUT}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$NCU" ] || { echo "error: ncu not found"; exit 1; }
SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats)
STALLS=(--metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
profile() {  # profile CASE [extra ncu arguments]
    local case=$1; shift
    timeout "${T_NCU_CASE:-150}" "$NCU" --clock-control none -k "regex:${NCU_KERNEL:-indexer_tiles}" --launch-skip 2 --launch-count 1 \
        "${SECTIONS[@]}" "$@" python3 scripts/h200/hot_ncu.py "$case" >"$OUT/ncu-$case.txt" 2>&1
}
for case in "$@"; do
    profile "$case" "${STALLS[@]}"; rc=$?
    if [ $rc -ne 0 ] && grep -q "Failed to find metric" "$OUT/ncu-$case.txt"; then  # this ncu names them otherwise
        profile "$case"; rc=$?
    fi
    echo "=== $case rc=$rc"
    grep -E "Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|L2 Hit Rate|L1/TEX Hit Rate|Compute \(SM\) Throughput|highest-utilized|==ERR|error" "$OUT/ncu-$case.txt" | head -24
    grep -E "stalled_.*ratio" "$OUT/ncu-$case.txt" | grep -vE " 0(\.0+)?$" | head -30
done
# one archive (a device call brings back a limited number of files)
cd "$OUT" && tar czf ncu.tgz ncu-*.txt && rm -f ncu-*.txt
