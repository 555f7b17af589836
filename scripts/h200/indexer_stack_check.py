"""The Gluon indexer's bf16 queries with a token's hi and lo parts as one MMA (``indexer_gluon.launch(stacked=True)``)
against two MMAs a token, same inputs: checked against the float64 reference, then timed, on one H200.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/indexer_stack_check.py

1. Edge cases, both launches on each case's same inputs: 8, 16, 20, 32 and 64 heads (64: an N = 128 MMA), blocks of
   64, 128 and 256 tokens, 1, 2 and 5 tokens a segment, an unmapped block, a causal bound mid-tile, bf16 query rows
   scaled by 1e-20 and 1e20, and a row holding NaN (NaN where the reference has NaN, the other rows as it).
2. bf16 queries on FP8 keys at 64 x 1 and 64 x 2 tokens at 128K keys and 8 x 1 at 1M, the backend's stages: ms, key
   bytes / time (TB/s, % of the copy ceiling), stacked / not.

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from indexer_gluon_cases import check_gluon, launch_as_backend, paged_case  # scripts/h200/indexer_gluon_cases.py
from score_check import score_error  # scripts/h200/score_check.py
from script_cli import finish, run, start  # scripts/h200/script_cli.py

TOL_FP8_MMA = 5e-4  # FP8 MMAs (the hi / lo split through Hopper's FP8 accumulator), as indexer_alu_sweep.py
STAGES = {1: 5, 2: 4}  # the backend's (config._BF16_Q_GLUON)


def edge_cases(torch, failures):
    gen = torch.Generator(device="cuda").manual_seed(11)
    for heads, block_tokens, requests, per_request, context, group in (
            (20, 128, 3, 5, 1000, 5), (64, 64, 2, 2, 900, 2), (32, 64, 5, 1, 700, 1), (16, 256, 2, 2, 1500, 2),
            (8, 64, 4, 1, 333, 1), (32, 64, 3, 2, 1000, 2)):
        q, w, pages, table, req, pos, out = paged_case(torch, "fp8", heads, block_tokens, requests, per_request,
                                                       context, torch.bfloat16, gen, "cuda")
        for stacked in (False, True):
            name = (f"bf16 q, {heads} heads, {block_tokens}-token blocks, {requests}x{per_request}, group {group}"
                    + (", stacked" if stacked else ""))

            def judge(got, want):
                err, same = score_error(torch, got, want)
                return same and err < TOL_FP8_MMA, f"rel err {err:.2e}"
            check_gluon(torch, name, (q, w, pages, table, req, pos), context, out.clone(), group, judge, failures,
                        tiles=2, wide_tiles=None, stacked=stacked)
    requests, per_request, context, heads = 3, 2, 500, 32
    blocks = requests * -(-context // 64) + 2
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, "cuda", 64)
    table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, "cuda", 64)
    q = torch.randn(requests * per_request, heads, 128, device="cuda", generator=gen)
    q[0, 5, 7] = float("nan")
    q = q.to(torch.bfloat16)
    w = torch.randn(requests * per_request, heads, device="cuda", generator=gen)
    for stacked in (False, True):
        def judge(got, want):
            same_nan = torch.equal(torch.isnan(got), torch.isnan(want)) and bool(torch.isnan(want[0]).any())
            err, same = score_error(torch, got[1:], want[1:])
            return same_nan and same and err < TOL_FP8_MMA, f"NaN as the reference: {same_nan}, rel err {err:.2e}"
        check_gluon(torch, "bf16 q, a row holding NaN" + (", stacked" if stacked else ""),
                    (q, w, pages, table, req, pos), context, torch.full((q.shape[0], context), 7.0, device="cuda"),
                    per_request, judge, failures, stages=3, stacked=stacked)


def sweep(torch, ceiling):
    gen = torch.Generator(device="cuda").manual_seed(5)
    k = 1024
    shapes = (("64x1 @128K", 64, 1, 128 * k), ("64x2 @128K", 64, 2, 128 * k), ("8x1 @1M", 8, 1, 1024 * k))
    blocks = max(r * -(-c // 64) for _, r, _, c in shapes)
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, "cuda", 64)
    rows = []
    for shape, requests, per_request, context in shapes:
        table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, "cuda", 64)
        tokens = requests * per_request
        q = torch.randn(tokens, 32, 128, device="cuda", generator=gen).to(torch.bfloat16)
        w = torch.randn(tokens, 32, device="cuda", generator=gen)
        out = torch.empty(tokens, context, device="cuda")
        times = {}
        for stages in sorted({STAGES[per_request], 5}):
            for stacked in (False, True):
                ms = timing.bench_ms(lambda: launch_as_backend(q, w, pages, table, req, pos, context, out,
                                                               segment=per_request, stages=stages, stacked=stacked),
                                     "cuda", warmup=5, rep=40)
                times[(stages, stacked)] = ms
                tbps = requests * context * 132 / (ms * 1e-3) / 1e12
                ratio = times[(stages, False)] / ms
                rows.append((shape, f"{stages} stages" + (", stacked" if stacked else ""), ms, tbps,
                             100 * tbps / ceiling, ratio))
        print(f"  {shape} timed", flush=True)
    print("\n| shape | bf16 q, Gluon | ms | key TB/s | % copy | unstacked / this |\n|---|---|---:|---:|---:|---:|")
    for shape, name, ms, tbps, pct, ratio in rows:
        print(f"| {shape} | {name} | {ms:.4f} | {tbps:.2f} | {pct:.1f} | {ratio:.3f} |")


def main() -> int:
    torch, triton, started, ceiling = start("indexer_stack_check", "cuda")
    failures: list[str] = []
    edge_cases(torch, failures)
    sweep(torch, ceiling)
    return finish("indexer_stack_check", failures, started)


if __name__ == "__main__":
    run("indexer_stack_check", main)
