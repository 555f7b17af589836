"""The warp-specialised Gluon indexer (``indexer_gluon`` ``warp_specialized``, ``producer_stores``) against the
backend's launch, checked against the float64 reference first, then timed in the same run (FP8 keys, 32 heads).

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/ws_probe.py

Twenty-seventh session: the producer warp copying the tiles (``warp_specialized``, 0.96-0.97x the default at 64 x 5,
three programs a SM) and also masking and storing the scores from the head sums the warpgroup leaves in shared memory
(``producer_stores``: the warpgroup's loop 254 instructions a tile against 327, sm_90, Triton 3.6).
"""
from __future__ import annotations

import time

import timing  # scripts/h200/timing.py
import pools as cache_pools  # scripts/h200/pools.py
from score_check import score_error  # scripts/h200/score_check.py
from script_cli import finish, run, start  # scripts/h200/script_cli.py
from indexer_gluon_cases import check_gluon, launch_as_backend, paged_case  # scripts/h200/indexer_gluon_cases.py

HEADS = 32
TOL_HEAD_SUM_MMA = 1e-3


def variants():
    """[(label, launch options or None for the backend's route)]."""
    ws = dict(head_sum_mma=True, depth=1, warp_specialized=True)
    return [("backend default", None),
            ("WS, 6 stages, 80 registers", dict(ws, stages=6, maxnreg=80)),
            ("WS + producer stores, 4 stages, 80 registers", dict(ws, stages=4, maxnreg=80, producer_stores=True,
                                                                  producer_regs=56)),
            ("WS + producer stores, 6 stages, 80 registers", dict(ws, stages=6, maxnreg=80, producer_stores=True,
                                                                  producer_regs=56))]


def runner(torch, changes):
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels.indexer import indexer_score

    if changes is None:
        cfg = dict(indexer_config(HEADS, torch.float8_e4m3fn, "fp8"))
        return lambda q, w, pages, table, req, pos, width, out: indexer_score(
            q, w, pages, table, req, pos, "fp8", width, out=out, **cfg)
    return lambda q, w, pages, table, req, pos, width, out: launch_as_backend(
        q, w, pages, table, req, pos, width, out, **changes)


def main(argv=None) -> int:
    torch, triton, started, ceiling = start("ws_probe", "cuda")
    failures: list[str] = []
    fp8 = torch.float8_e4m3fn
    gen = torch.Generator(device="cuda").manual_seed(11)
    print("\nchecks against the float64 reference")
    passed = set()
    for heads, block_tokens, requests, per_request, context, group in (
            (32, 64, 3, 5, 1000, 5), (16, 64, 2, 3, 700, 3), (20, 128, 3, 5, 1000, 5), (64, 128, 2, 2, 900, 2),
            (32, 256, 2, 8, 1500, 5), (8, 64, 4, 1, 333, 1), (32, 64, 2, 8, 1100, 8)):
        q, w, pages, table, req, pos, out = paged_case(torch, "fp8", heads, block_tokens, requests, per_request,
                                                       context, fp8, gen, "cuda")
        for label, changes in variants()[1:]:
            for tiles in (2, 5):
                out.fill_(float("nan"))
                name = f"{label}, {heads} heads, {block_tokens}-token blocks, {requests}x{per_request}, group {group}, " \
                       f"{tiles} tiles a program"

                def judge(got, want):
                    err, same = score_error(torch, got, want)
                    return same and err < TOL_HEAD_SUM_MMA, f"rel err {err:.2e}"
                before = len(failures)
                check_gluon(torch, name, (q, w, pages, table, req, pos), context, out, group, judge, failures,
                            tiles=tiles, wide_tiles=None, **changes)
                if len(failures) == before and heads == 32 and group == 5 and tiles == 5:
                    passed.add(label)
    passed.add("backend default")
    print(f"\ntiming ({time.time() - started:.0f} s)", flush=True)
    k = 1024
    blocks = 64 * 2048  # (64 requests x 128K keys in 64-token blocks)
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, "cuda", 64)
    rows = []
    for shape, requests, per_request, context in (("64x5 @128K", 64, 5, 128 * k), ("64x2 @128K", 64, 2, 128 * k),
                                                  ("64x1 @128K", 64, 1, 128 * k), ("1x4096 @32K", 1, 4096, 32 * k)):
        table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, "cuda", 64)
        tokens = requests * per_request
        q = torch.randn(tokens, HEADS, 128, device="cuda", generator=gen).to(fp8)
        w = torch.randn(tokens, HEADS, device="cuda", generator=gen)
        out = torch.empty(tokens, context, device="cuda")
        base = None
        for label, changes in variants():
            if label not in passed:
                continue
            fn = runner(torch, changes)
            ms = timing.bench_ms(lambda: fn(q, w, pages, table, req, pos, context, out), "cuda", warmup=5, rep=40)
            base = base or ms
            pct = 100 * requests * context * 132 / (ms * 1e-3) / 1e12 / ceiling
            rows.append((shape, label, ms, pct, base / ms))
    print("\n| shape | variant | ms | % copy | vs default |\n|---|---|---|---|---|")
    for shape, label, ms, pct, ratio in rows:
        print(f"| {shape} | {label} | {ms:.3f} | {pct:.1f} | {ratio:.2f}x |")
    return finish("ws_probe", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("ws_probe", main)
