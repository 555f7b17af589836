#!/usr/bin/env bash
# The test suite, from nothing but Python (what CI runs through .ci/run). Two parts, each announced by
# a one-line banner:
#   1. pytest over tests/ in .venv (torch 2.13.0; scripts/env.sh builds it);
#   2. the TPU backend's job, scripts/test-tpu.sh: tests_tpu/ and the conformance suite against `tpu`
#      on XLA's CPU client, in its own environment .venv-tpu (torch 2.9.0 + torch-xla 2.9.0).
# Without arguments both parts run, the second beside the first (its output kept in reports/test-tpu.log and
# printed when part 1 is done): part 1 leaves about a quarter of two cores idle (its files do not split evenly
# over the workers) and part 2 begins with a 7 GB install, so together they take less time than one after the
# other. DSAHAL_TPU_AFTER=1 runs part 2 after part 1 instead. Arguments are pytest arguments for part 1 (`-k registry`,
# `tests/test_plan.py`) and select tests of tests/ only, so part 2 is then skipped with a line saying
# so: run `scripts/test-tpu.sh [pytest arguments for tests_tpu/]` for it. DSAHAL_SKIP_TPU=1 always
# skips part 2; DSAHAL_WITH_TPU=1 runs it even with arguments. DSAHAL_TEST_WORKERS: part 1's processes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
# One thread per process: the suite spawns gloo ranks and helper processes on a 2-core machine.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
start=$SECONDS
# Part 1 in DSAHAL_TEST_WORKERS processes (default 2, the CI machine's cores; 1: one process), whole files to a
# worker (their module fixtures, the Triton interpreter children, run once): most of part 1 is single-threaded
# interpreter children, so two workers take about half the time on two cores.
workers="${DSAHAL_TEST_WORKERS:-2}"
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: DSAHAL_TEST_WORKERS expected a positive number of processes, got '$workers'" >&2
    exit 2
fi
parallel=()
if [ "$workers" -gt 1 ] && python -c "import xdist" 2>/dev/null; then
    parallel=(-n "$workers" --dist loadfile)
elif [ "$workers" -gt 1 ]; then
    echo "== pytest-xdist is not installed: part 1 runs in one process"
fi
tpu_pid=""
tpu_log="$ROOT/reports/test-tpu.log"
if [ "${DSAHAL_SKIP_TPU:-0}" = "1" ]; then
    tpu_mode=skip
elif [ "$#" -gt 0 ] && [ "${DSAHAL_WITH_TPU:-0}" != "1" ]; then
    tpu_mode=args
elif [ "${DSAHAL_TPU_AFTER:-0}" = "1" ]; then
    tpu_mode=after
else
    tpu_mode=beside
fi
stop_tpu() {  # part 2's whole process group (pip, pytest, the conformance parts), if it is still running
    if [ -n "$tpu_pid" ] && kill -0 "$tpu_pid" 2>/dev/null; then
        kill -TERM -- "-$tpu_pid" 2>/dev/null || kill -TERM "$tpu_pid" 2>/dev/null || true
    fi
}
if [ "$tpu_mode" = beside ]; then
    mkdir -p "$(dirname "$tpu_log")"
    echo "== part 2/2 (TPU backend job) starts beside part 1; its output: $tpu_log, printed after part 1"
    # its own session (process group), so that an interrupted or failed run stops all of it
    if command -v setsid >/dev/null; then
        setsid "$ROOT/scripts/test-tpu.sh" >"$tpu_log" 2>&1 &
    else
        "$ROOT/scripts/test-tpu.sh" >"$tpu_log" 2>&1 &
    fi
    tpu_pid=$!
    trap stop_tpu EXIT
fi
echo "== part 1/2: pytest tests/ in .venv${parallel:+ (${workers} workers)}${*:+ (arguments: $*)}"
python -m pytest -q "${parallel[@]}" "$@" || { rc=$?; echo "== part 1/2 failed (pytest exit status $rc)"; exit "$rc"; }
echo "== part 1/2 passed in $((SECONDS - start)) s"
case "$tpu_mode" in
    skip) echo "== part 2/2 (TPU backend job) skipped: DSAHAL_SKIP_TPU=1" ;;
    args) echo "== part 2/2 (TPU backend job) skipped: the arguments select tests of tests/ only;" \
               "run scripts/test-tpu.sh for it (or DSAHAL_WITH_TPU=1)" ;;
    after) "$ROOT/scripts/test-tpu.sh" ;;
    beside)
        tpu_rc=0
        wait "$tpu_pid" || tpu_rc=$?
        tpu_pid=""
        cat "$tpu_log"
        if [ "$tpu_rc" -ne 0 ]; then
            echo "== part 2/2 failed (exit status $tpu_rc; its output above, also in $tpu_log)"
            exit "$tpu_rc"
        fi
        echo "== both parts passed in $((SECONDS - start)) s" ;;
esac
