#!/usr/bin/env bash
# The test suite, from nothing but Python (what CI runs through .ci/run). Two parts, each announced by
# a one-line banner:
#   1. pytest over tests/ in .venv (torch 2.13.0; scripts/env.sh builds it);
#   2. the TPU backend's job, scripts/test-tpu.sh: tests_tpu/ and the conformance suite against `tpu`
#      on XLA's CPU client, in its own environment .venv-tpu (torch 2.9.0 + torch-xla 2.9.0).
# Without arguments both parts run, one after the other; part 2's environment (a 3.9 GiB download, 7.1 GiB installed,
# scripts/tpu-env.sh) is built beside part 1, its output kept in reports/tpu-env.log (printed if it fails):
# the download waits on the network, not on the two cores part 1 keeps busy. The whole of part 2 beside part
# 1 was no faster (fourteenth session: 14:29 against 13:53 one after the other on this 2-core machine, the cores
# being the limit). DSAHAL_TPU_AFTER=1 builds the environment after part 1 too. Arguments are pytest arguments
# for part 1 (`-k registry`, `tests/test_plan.py`) and select tests of tests/ only, so part 2 is then skipped
# with a line saying so: run `scripts/test-tpu.sh [pytest arguments for tests_tpu/]` for it. DSAHAL_SKIP_TPU=1
# always skips part 2; DSAHAL_WITH_TPU=1 runs it even with arguments. DSAHAL_TEST_WORKERS: part 1's processes.
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
env_pid=""
env_log="$ROOT/reports/tpu-env.log"
if [ "${DSAHAL_SKIP_TPU:-0}" = "1" ]; then
    tpu_mode=skip
elif [ "$#" -gt 0 ] && [ "${DSAHAL_WITH_TPU:-0}" != "1" ]; then
    tpu_mode=args
elif [ "${DSAHAL_TPU_AFTER:-0}" = "1" ]; then
    tpu_mode=after
else
    tpu_mode=beside
fi
# Free disk, said first: a run that fills the disk fails wherever the disk ran out (a CI run of the twenty-eighth
# session's work failed that way in part 1's temporary files while part 2's environment was being built, and the
# thirty-first's in part 2's install, after part 1). Part 2's environment is installed one wheel at a time without
# pip's cache (scripts/pip-quiet.sh): 7.1 GiB installed, at most one wheel (< 1 GiB) more at its peak (measured
# 2026-12-05; one `pip install` of it had kept 3.9 GiB of wheels in pip's cache beside it). Part 1 takes ~1 GiB of
# temporary files; with less free than both need, the environment is built after part 1 instead of beside it, so
# that part 1 has the disk to itself.
free_gib() {  # free GiB of the file system holding $1
    df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'
}
root_free="$(free_gib "$ROOT")"
tmp_free="$(free_gib "${TMPDIR:-/tmp}")"
echo "== disk: ${root_free:-?} GiB free under $ROOT, ${tmp_free:-?} GiB under ${TMPDIR:-/tmp}"
if [ "$tpu_mode" = beside ] && [ ! -x "$ROOT/.venv-tpu/bin/python" ] \
    && { [ "${root_free:-99}" -lt 10 ] || [ "${tmp_free:-99}" -lt 10 ]; }; then
    echo "== less than 10 GiB free: part 2's environment (~8 GiB at its peak) is built after part 1, not beside it"
    tpu_mode=after
fi
if [ "$tpu_mode" != skip ] && [ ! -x "$ROOT/.venv-tpu/bin/python" ] && [ "${root_free:-99}" -lt 9 ]; then
    echo "== warning: ${root_free} GiB free under $ROOT; part 2's environment needs ~8 GiB and may not fit"
fi
stop_env() {  # the environment build's whole process group (pip and its children), if it is still running
    if [ -n "$env_pid" ] && kill -0 "$env_pid" 2>/dev/null; then
        kill -TERM -- "-$env_pid" 2>/dev/null || kill -TERM "$env_pid" 2>/dev/null || true
    fi
}
if [ "$tpu_mode" = beside ]; then
    mkdir -p "$(dirname "$env_log")"
    echo "== part 2/2's environment (.venv-tpu) is built beside part 1; its output: $env_log"
    # its own session (process group), so that an interrupted or failed run stops all of it
    if command -v setsid >/dev/null; then
        setsid bash "$ROOT/scripts/tpu-env.sh" >"$env_log" 2>&1 &
    else
        bash "$ROOT/scripts/tpu-env.sh" >"$env_log" 2>&1 &
    fi
    env_pid=$!
    trap stop_env EXIT
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
        env_rc=0
        wait "$env_pid" || env_rc=$?
        env_pid=""
        if [ "$env_rc" -ne 0 ]; then
            cat "$env_log"
            echo "== part 2/2 failed: building its environment (exit status $env_rc; output above, also in $env_log)"
            exit "$env_rc"
        fi
        "$ROOT/scripts/test-tpu.sh" ;;  # (its environment is up to date: no install)
esac
