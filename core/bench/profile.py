"""Run bench cases once each inside a CUDA profiler range, for Nsight Compute's hardware counters.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python -m dsahal.bench.profile [--op OP ...] [--match TEXT ...]

Each selected case (``dsahal bench``'s shapes) is built and run once outside the range (compiles,
autotuning, first-touch allocations), then once between ``cudaProfilerStart`` and ``cudaProfilerStop``,
so ncu profiles only the kernels of the measured call. A line naming the case is printed before each
range, so the report's kernels can be matched to cases in order. The bench's correctness checks are
not repeated here: ``dsahal bench`` runs them on the same code.
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

import torch

from ..registry import use_backend
from .cases import all_cases

# The kernels of docs/performance.md's targets ("name | shape" of dsahal bench's rows): what --targets profiles.
TARGET_CASES = (
    "indexer fp8 q / fp8 keys | 64x5 tok, ctx 131072",
    "topk k=2048 | [320, 131072]",
    "sparse MLA bf16 | 320 tok, H=128",
    "sparse MLA bf16 | 320 tok, H=16",
    "KDA decode | B=256, H=32",
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsahal.bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="nvidia")
    parser.add_argument("--op", action="append", default=None, help="op families (default: all with a shape)")
    parser.add_argument("--match", action="append", default=None,
                        help="keep cases whose 'name shape' contains this text (any of several)")
    parser.add_argument("--targets", action="store_true",
                        help="the cases of docs/performance.md's targets (TARGET_CASES)")
    parser.add_argument("--quick", action="store_true", help="the bench's reduced shapes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (it drives a GPU profiler)")
    cases = [c for c in all_cases(args.quick) if c.build is not None and (args.op is None or c.op in args.op)]
    if args.match:
        cases = [c for c in cases if any(m in f"{c.name} {c.shape}" for m in args.match)]
    if args.targets:
        cases = [c for c in cases if f"{c.name} | {c.shape}" in TARGET_CASES]
    if not cases:
        parser.error("no bench case matches --op/--match")
    device = torch.device("cuda")
    with use_backend(args.backend):
        for case in cases:
            built = case.build(device)
            built.run()  # compile and warm up outside the profiled range
            torch.cuda.synchronize()
            print(f"profile: {case.name} | {case.shape}", flush=True)
            torch.cuda.profiler.start()
            built.run()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            del built
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
