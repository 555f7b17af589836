"""Which Triton compilations a first ``dsahal run`` waits for: every compile of a fresh run, on which thread,
when, how long, per stage.

Usage (a fresh process; the Triton cache is a new empty directory unless ``--keep-cache``)::

    python3 scripts/h200/compile_timeline.py [-- RUN ARGS...]    # default: run --config k31-pro-slice --backend nvidia

Runs ``dsahal run`` in this process with Triton's compilation listener (``triton.knobs.compilation.listener``)
recording each compile: kernel name, the thread that compiled it (``dsahal-warmup_N`` are the warm-up jobs),
its end time relative to the first compile, its seconds and its stages (IR build incl. the AST code
generator, ttir, ttgir, llir, ptx, cubin). Prints the run's own output, then one table sorted by start, then
per thread the busy seconds. A Triton without the listener knob: says so and exits 1.
"""
from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

RECORDS: list[tuple] = []


def listener(*, src, metadata, metadata_group, times, cache_hit):
    end = time.time()
    fn = getattr(src, "fn", None)
    name = getattr(fn, "__name__", None) or str(getattr(src, "name", "?"))
    stages = [("ir", times.ir_initialization)] + list(times.lowering_stages)
    total = sum(us for _, us in stages) + times.store_results
    RECORDS.append((end - total / 1e6, end, name, threading.current_thread().name, total / 1e6, stages, cache_hit))


def main(argv) -> int:
    keep = "--keep-cache" in argv
    argv = [a for a in argv if a != "--keep-cache"]
    if "--" in argv:
        run_args = argv[argv.index("--") + 1:]
    else:
        run_args = ["run", "--config", "k31-pro-slice", "--backend", "nvidia"]
    if not keep:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fresh-triton-")
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.compilation, "listener"):
        print(f"error: Triton {triton.__version__} has no knobs.compilation.listener")
        return 1
    knobs.compilation.listener = listener
    from dsahal.cli import main as cli

    began = time.time()
    rc = cli(run_args)
    if not RECORDS:
        print("no compilations recorded")
        return rc
    first = min(r[0] for r in RECORDS)
    print(f"\n{len(RECORDS)} compiles; first at +{first - began:.2f} s after the run started; "
          f"last ended at +{max(r[1] for r in RECORDS) - began:.2f} s")
    print("| start s | end s | seconds | thread | kernel | stages (s) |")
    print("| ---: | ---: | ---: | --- | --- | --- |")
    for start, end, name, thread, seconds, stages, hit in sorted(RECORDS):
        parts = " ".join(f"{stage} {us / 1e6:.2f}" for stage, us in stages)
        print(f"| {start - began:.2f} | {end - began:.2f} | {seconds:.2f} | {thread} | {name}{' (hit)' if hit else ''} "
              f"| {parts} |")
    busy: dict[str, float] = {}
    for record in RECORDS:
        busy[record[3]] = busy.get(record[3], 0.0) + record[4]
    print("\nper thread: " + ", ".join(f"{t} {s:.2f} s" for t, s in sorted(busy.items(), key=lambda x: -x[1])))
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
