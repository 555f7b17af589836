#!/usr/bin/env bash
# Nsight Compute at the SASS line: where one kernel's warps wait, instruction by instruction (hot_ncu.py's cases,
# the third launch of the kernel NCU_KERNEL names). Per case: $OUT/ncu-<case>.txt (speed of light, occupancy, warp
# states, source counters) and the hot instructions (sass_hotspots.py) printed; the source pages as CSV packed into
# $OUT/sass.tgz.
#   OUT=... NCU_KERNEL=sparse_mla_wgmma bash scripts/h200/ncu_source.sh wgmma16
set -uo pipefail
OUT="${OUT:?set OUT}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$NCU" ] || { echo "error: ncu not found"; exit 1; }
mkdir -p /tmp/ncu-src
for case in "$@"; do
    timeout "${T_NCU_CASE:-150}" "$NCU" --clock-control none -k "regex:${NCU_KERNEL:?set NCU_KERNEL}" --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters --import-source no -f -o "/tmp/ncu-src/$case" \
        python3 scripts/h200/hot_ncu.py "$case" >"$OUT/ncu-$case.log" 2>&1
    echo "=== $case rc=$?"
    "$NCU" --import "/tmp/ncu-src/$case.ncu-rep" --page details >"$OUT/ncu-$case.txt" 2>&1
    grep -E "Duration|Executed Instructions  |Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|==ERR|error" "$OUT/ncu-$case.txt" | head -16
    "$NCU" --import "/tmp/ncu-src/$case.ncu-rep" --page source --csv --print-source sass >"/tmp/ncu-src/$case-sass.csv" 2>&1
    python3 scripts/h200/sass_hotspots.py "/tmp/ncu-src/$case-sass.csv" --top "${TOP:-45}" | tee "$OUT/ncu-$case-hot.txt"
done
cd /tmp/ncu-src && tar czf "$OUT/sass.tgz" ./*-sass.csv
