"""The groups top-k's four passes, kernel by kernel, at the backend's launch and its neighbours (issue 18).

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/topk_pass_probe.py

Why: inside the DSA layer (64 x 5 tokens at 128K) the top-k takes 181-183 us, its first pass reading the scores at
80% of copy and the other three (threshold, compaction, finish: 132 us) latency-bound (BENCHMARKS.md, twenty-seventh
session, ``kernel_breakdown.py``). Real indexer scores ``[320, 128K]`` (``dsahal.bench.cases.build_topk_of_indexer``'s
inputs); each variant's output first compared bit for bit with the backend's launch (the tie rule's set in index
order: every correct launch gives the same), then 20 calls under ``torch.profiler``: us a call per kernel.
"""
from __future__ import annotations

import collections

from script_cli import CheckError, run  # scripts/h200/script_cli.py

CALLS = 20


def per_kernel(torch, fn):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    times = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name.replace("_kernel", "")[:24]] += event.device_time / CALLS
    return times


def main(argv=None) -> int:
    import torch

    from dsahal import ops
    from dsahal.backends.nvidia.config import _TOPK_GROUPS
    from dsahal.backends.triton_kernels.topk import topk
    from dsahal.bench.cases import INDEX_HEADS
    from dsahal.bench.inputs import decode_batch, random_pages
    from dsahal.registry import use_backend

    if not torch.cuda.is_available():
        raise SystemExit("error: topk_pass_probe needs a CUDA device")
    ctx = 128 * 1024
    with use_backend("nvidia"):
        block_table, req_ids, positions, num_blocks = decode_batch(64, 5, ctx, 64, "cuda")
        pages = random_pages("index", "fp8", num_blocks, 64, "cuda")
        q = torch.randn(req_ids.shape[0], INDEX_HEADS, 128, device="cuda").to(torch.float8_e4m3fn)
        w = torch.rand(req_ids.shape[0], INDEX_HEADS, device="cuda")
        scores = ops.indexer_score(q, w, pages, block_table, req_ids, positions, index_fmt="fp8", max_context=ctx,
                                   check=False)
    del pages
    lengths = (positions + 1).to(torch.int32)
    base = dict(_TOPK_GROUPS)
    variants = [("backend launch", {}), ("batch 32", dict(batch=32)), ("batch 128", dict(batch=128)),
                ("max / threshold / compaction at 8 warps", dict(num_warps=8)),
                ("finish at 4 warps", dict(finish_warps=4)), ("finish chunk 2048", dict(finish_chunk=2048)),
                ("16-step segments", dict(steps=16)), ("2048-entry steps", dict(chunk=2048, steps=16))]
    want = topk(scores, lengths, 2048, **base)
    rows, failures = [], []
    for label, change in variants:
        cfg = dict(base, **change)
        got = topk(scores, lengths, 2048, **cfg)
        if not torch.equal(got, want):
            failures.append(label)
            print(f"  {label}: output differs from the backend launch's")
            continue
        rows.append((label, per_kernel(torch, lambda: topk(scores, lengths, 2048, **cfg))))
    names = sorted({name for _, times in rows for name in times})
    print("\n| variant | " + " | ".join(names) + " | sum |\n|---|" + "---|" * (len(names) + 1))
    for label, times in rows:
        print(f"| {label} | " + " | ".join(f"{times.get(n, 0.0):.1f}" for n in names)
              + f" | {sum(times.values()):.1f} |")
    if failures:
        raise CheckError(f"topk_pass_probe: {len(failures)} variant(s) differ from the backend launch: {failures}")
    return 0


if __name__ == "__main__":
    run("topk_pass_probe", main)
