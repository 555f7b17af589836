"""Exact top-k (k = 2048) of few, very long rows on one Hopper GPU: the NVIDIA backend's default against its
group sizes and methods and ``torch.topk``, on real indexer scores, checked before timed.

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/topk_wide_sweep.py [--cpu-smoke]

Why: in the thirteenth session's R1 the default top-k of 8 rows of 1M indexer scores (8 requests x 1 token at
1M context, the seed's long-context decode) took 0.329 ms against ``torch.topk``'s 0.190, as long as the indexer
before it: with 8 rows its per-row passes (the threshold over 64K group maxima a row, the finish) run on 8
programs. Larger groups leave fewer maxima a row (16 entries a group: 65,536; 64: 16,384).

Steps: the copy ceiling; indexer scores (FP8 keys, FP8 queries, 32 heads, 64-token blocks) for each case; every
variant checked on every row (the tie rule's set from torch.topk's k-th value, -1 padding last) then timed
(``do_bench`` medians). One table: case, variant, ms, ratio to ``torch.topk`` and to the default.
"""
from __future__ import annotations

import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import finish, run, smoke_args, start  # scripts/h200/script_cli.py
from topk_sweep import expected_mask  # scripts/h200/topk_sweep.py

K = 2048
HEADS = 32
BLOCK_TOKENS = 64
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1


def cases():
    """[(label, requests, tokens per request, keys per request)]."""
    if DEVICE == "cpu":
        return [("2x1 @4K", 2, 1, 4096)]
    k = 1024
    return [("8x1 @1M", 8, 1, 1024 * k), ("8x2 @1M", 8, 2, 1024 * k), ("64x1 @128K", 64, 1, 128 * k),
            ("320 @128K (64x5)", 64, 5, 128 * k)]


def variants():
    """[(name, topk kwargs or None for the backend default)]."""
    groups = dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4, finish_chunk=1024, finish_warps=8)
    if DEVICE == "cpu":
        groups = dict(method="groups", chunk=64, steps=2, batch=8, finish_chunk=64)
    out = [("backend default", None)]
    for size in (16, 32, 64, 128) if DEVICE == "cuda" else (4, 8):
        out.append((f"groups G{size}", dict(groups, group_size=size)))
    if DEVICE == "cuda":
        out.append(("groups G64 steps 64", dict(groups, group_size=64, steps=64)))
        out.append(("bound c1024", dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4)))
        out.append(("radix 16 segments", dict(chunk=2048, row_levels=2, num_warps=8, segments=16)))
    return out


def scores_for(torch, requests, per_request, context, pages, gen):
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels.indexer import indexer_score

    blocks = pages.shape[0]
    table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE,
                                               BLOCK_TOKENS)
    tokens = req.shape[0]
    q = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen).to(torch.float8_e4m3fn)
    w = torch.rand(tokens, HEADS, device=DEVICE, generator=gen) + 0.01
    cfg = dict(indexer_config(HEADS, q.dtype, "fp8"))
    if DEVICE == "cpu":
        cfg["block_tiles"] = dict(cfg["block_tiles"], block_n=16, tiles=2)
    scores = indexer_score(q, w, pages, table, req, pos, "fp8", context, **cfg)
    return scores, torch.clamp(pos + 1, max=context).to(torch.int32)


def check(torch, got, mask) -> str:
    width = mask.shape[1]
    valid = got >= 0
    chosen = torch.zeros(mask.shape[0], width + 1, dtype=torch.bool, device=mask.device)
    chosen.scatter_(1, torch.where(valid, got, width).long(), True)
    if not torch.equal(chosen[:, :width], mask) or int(valid.sum()) != int(mask.sum()):
        return "not the tie rule's set"
    if not bool((valid[:, 1:] <= valid[:, :-1]).all()):
        return "-1 padding not last"
    return ""


def main(argv=None) -> int:
    global DEVICE, BLOCK_TOKENS, K
    if smoke_args(__doc__.splitlines()[0], argv).cpu_smoke:
        DEVICE, BLOCK_TOKENS, K = "cpu", 16, 64
    torch, triton, started, ceiling = start("topk_wide_sweep", DEVICE)
    from dsahal.backends.nvidia.config import topk_config
    from dsahal.backends.triton_kernels.topk import topk

    gen = torch.Generator(device=DEVICE).manual_seed(11)
    blocks = max(r * -(-c // BLOCK_TOKENS) for _, r, _, c in cases())
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, BLOCK_TOKENS)
    failures, rows = [], []
    for label, requests, per_request, context in cases():
        scores, lengths = scores_for(torch, requests, per_request, context, pages, gen)
        mask = expected_mask(torch, scores, lengths, K)
        peer = timing.bench_ms(lambda: torch.topk(scores, K, dim=1), DEVICE, warmup=5, rep=40)
        rows.append((label, "torch.topk", peer, 1.0, None))
        default_ms = None
        for name, kw in variants():
            kw = topk_config(context) if kw is None else kw
            try:
                problem = check(torch, topk(scores, lengths, K, **kw), mask)
            except Exception as exc:  # noqa: BLE001 - a variant that fails to run is listed
                problem = f"{type(exc).__name__}: {str(exc)[:160]}"
            print(f"  check {label:<18s} {name:<22s} {problem or 'ok'}", flush=True)
            if problem:
                failures.append(f"{label} {name}: {problem}")
                continue
            ms = timing.bench_ms(lambda: topk(scores, lengths, K, **kw), DEVICE, warmup=5, rep=40)
            default_ms = ms if default_ms is None else default_ms
            rows.append((label, name, ms, peer / ms, default_ms / ms))
        del scores, mask
        print(f"  {label} done ({time.time() - started:.0f} s)", flush=True)
    print("\n| case | variant | ms | torch.topk / variant | default / variant |\n|---|---|---:|---:|---:|")
    for label, name, ms, vs_peer, vs_default in rows:
        print(f"| {label} | {name} | {ms:.4f} | {vs_peer:.2f} | {'' if vs_default is None else f'{vs_default:.2f}'} |")
    return finish("topk_wide_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("topk_wide_sweep", main)
