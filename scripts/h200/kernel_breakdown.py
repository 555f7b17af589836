"""Where one DSA layer call's GPU time goes, kernel by kernel, on the `nvidia` backend (and the top-k's passes).

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/kernel_breakdown.py

Why (issue 18, items 4 and 5): ``dsahal bench`` times the DSA layer (64 x 5 tokens at 128K, fp8_ds_mla latents, FP8
index keys, top-k 2048) as a whole, 2.3x the sum of its parts' floors; this names the parts. Cases as the bench
builds them (``dsahal.bench.cases.build_dsa``, ``build_topk_of_indexer``): each call run 5 times to warm, then 20
times under ``torch.profiler``; per kernel (names truncated) the GPU time a call (us) and its share, and the sum of
the kernels against the eager wall time a call (``timing.bench_ms``).
"""
from __future__ import annotations

import collections

import timing  # scripts/h200/timing.py
from script_cli import run  # scripts/h200/script_cli.py

CALLS = 20


def breakdown(torch, label, fn):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name[:60]] += event.device_time / CALLS  # us
    wall_ms = timing.bench_ms(fn, "cuda", warmup=3, rep=30)
    total = sum(per_kernel.values())
    print(f"\n{label}: kernels {total:.1f} us a call, eager wall {wall_ms * 1000:.1f} us")
    print("| kernel | us a call | share |\n|---|---|---|")
    for name, us in sorted(per_kernel.items(), key=lambda item: -item[1]):
        print(f"| {name} | {us:.1f} | {100 * us / total:.1f}% |")


def main(argv=None) -> int:
    import torch

    from dsahal.bench.cases import build_dsa, build_topk_of_indexer
    from dsahal.registry import use_backend

    if not torch.cuda.is_available():
        raise SystemExit("error: kernel_breakdown needs a CUDA device")
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    with use_backend("nvidia"):
        ctx = 128 * 1024
        built = build_topk_of_indexer(64, 5, ctx)("cuda")
        breakdown(torch, "top-k 2048 of indexer scores [320, 128K]", built.run)
        del built
        for heads in (128, 16):
            built = build_dsa(64, 5, ctx, heads, kv_fmt="fp8_ds_mla")("cuda")
            breakdown(torch, f"DSA layer 64 x 5 at 128K, fp8_ds_mla, H = {heads}", built.run)
            del built
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    run("kernel_breakdown", main)
