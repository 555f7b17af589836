"""Paged lightning indexer on one Hopper GPU: the general kernel (backend default) against the block-tile
path (``backends/triton_kernels/indexer_decode.py``), checked and timed in the same run.

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/indexer_sweep.py [--cpu-smoke]

Steps, in order, each printed:

1. the device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. every variant on a small paged case (3 requests x 5 tokens at 1000 keys, an unmapped block, a shorter
   causal bound, 32 heads, 64-token blocks scattered by a random permutation) against the float64
   reference (on the CPU): relative error and the -inf mask, FP8 MMAs at 5e-4 (Hopper's FP8 accumulator),
   every other path at 1e-4;
3. timing (``triton.testing.do_bench`` median) of the variants that passed, at 64 x 1, 64 x 2, 64 x 5
   tokens at 128K keys, 8 x 1 at 1M and a prefill chunk (4096 tokens of one request, positions 28K..32K),
   FP8 (132 B) keys with FP8 and bf16 queries, MXFP4 (68 B) keys with bf16 queries. One table: ms, unique
   key bytes / time (TB/s and % of the copy ceiling), TFLOP/s of the real (unpadded) dots, and the ratio
   to the backend default on the same shape.

The prefill chunk reads 4.3 MB of keys (L2-resident) 512 times: its key-bytes column is not a bandwidth,
and its TFLOP/s column says how close it runs to the tensor cores.

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
"""
from __future__ import annotations

import sys
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from score_check import score_error  # scripts/h200/score_check.py
from script_cli import finish, run, smoke_args, start  # scripts/h200/script_cli.py

HEADS = 32
BLOCK_TOKENS = 64
TOL = 1e-4
TOL_FP8_MMA = 5e-4
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1



def shapes():
    """[(label, requests, tokens per request, keys per request)]."""
    if DEVICE == "cpu":
        return [("2x1 @48", 2, 1, 48), ("2x5 @48", 2, 5, 48), ("prefill 20 @48", 1, 20, 48)]
    k = 1024
    return [("64x1 @128K", 64, 1, 128 * k), ("64x2 @128K", 64, 2, 128 * k), ("64x5 @128K", 64, 5, 128 * k),
            ("8x1 @1M", 8, 1, 1024 * k), ("prefill 4096 @32K", 1, 4096, 32 * k)]


def variants(torch):
    """[(keys, q dtype, label, launcher kwargs)]: the backend's configuration first per (keys, q)."""
    from dsahal.backends.nvidia.config import indexer_config

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    if DEVICE == "cpu":  # interpreter: bf16 dots are wrong there; FP8 MMAs and dot_scaled are exact
        small = dict(block_n=16, group=2, tiles=2)
        tiles = dict(small, block_tiles=True, group=8, tiles=2, tile_loop=1, typed_keys=True)
        return [("fp8", fp8, "backend default", small), ("fp8", fp8, "tiles prefetch", tiles),
                ("fp8", fp8, "tiles prefetch2", dict(tiles, tile_loop=3)),
                ("mxfp4", fp8, "tiles dot_scaled", dict(tiles, mxfp4_dot_scaled=True))]
    # registers per thread in the sm_90 AOT compile (local Triton 3.9) in brackets: 4 warps at <= 128
    # keep 4 programs on an SM, at <= 168 three, at <= 255 two
    out = []
    for q in (fp8, bf16):
        tiles = dict(block_n=64, tile_group=5, tiles=16, block_tiles=True, typed_keys=True, num_stages=1, tile_loop=1,
                     num_warps=4)
        out += [("fp8", q, "backend default", dict(indexer_config(HEADS, q, "fp8"))),
                ("fp8", q, "tiles prefetch x16", tiles),  # [fp8 q 120, bf16 q 151]
                ("fp8", q, "tiles prefetch2 x16", dict(tiles, tile_loop=3))]  # [182, 188]
        if q == fp8:  # (bf16 queries: 214 registers in the pipelined loop)
            out.append(("fp8", q, "tiles pipelined x8 s3", dict(tiles, tiles=8, tile_loop=2, num_stages=3)))  # [123]
            # uint8 view: the keys reach the MMA from registers (A operand), not re-read from shared
            # memory by each token's MMA (at N = 32 those reads, not the tensor cores, may bound it)
            out.append(("fp8", q, "tiles prefetch x16 A-regs", dict(tiles, typed_keys=False)))  # [134]
    # MXFP4 tiles are 4.3 KB (FP8: 8.4 KB): more of them must be in flight for the same bytes
    tiles = dict(block_n=64, tile_group=5, tiles=16, block_tiles=True, num_stages=1, tile_loop=1, num_warps=4)
    out += [("mxfp4", bf16, "backend default", dict(indexer_config(HEADS, bf16, "mxfp4"))),
            ("mxfp4", bf16, "tiles decode x16", dict(tiles, mxfp4_dot_scaled=False)),  # [213]
            ("mxfp4", bf16, "tiles dot_scaled x16", dict(tiles, mxfp4_dot_scaled=True)),  # [136]
            ("mxfp4", bf16, "tiles dot_scaled prefetch2 x16", dict(tiles, tile_loop=3, mxfp4_dot_scaled=True))]  # [162]
    return out


def build_pool(torch, fmt, blocks, gen):
    return cache_pools.index_pool(torch, fmt, blocks, gen, DEVICE, BLOCK_TOKENS)


def inputs(torch, requests, per_request, context, blocks, gen):
    """:func:`pools.decode_batch` on this script's device and block size."""
    return cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE, BLOCK_TOKENS)


def _name(fmt, q_dtype, label):
    return f"{fmt} keys, {str(q_dtype).split('.')[-1]} q, {label}"


def check(torch, chosen, failures):
    """Every variant against the float64 reference on a small paged case -> the names that passed."""
    from dsahal.backends.triton_kernels.indexer import indexer_score
    from dsahal.reference.indexer import indexer_score as reference

    gen = torch.Generator(device=DEVICE).manual_seed(3)
    requests, per_request, context = (3, 5, 1000) if DEVICE == "cuda" else (2, 5, 40)
    blocks = 64 if DEVICE == "cuda" else 8
    pools = {fmt: build_pool(torch, fmt, blocks, gen) for fmt in ("fp8", "mxfp4")}
    table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
    table[0, table.shape[1] // 2] = -1  # an unmapped block
    pos[per_request] = context // 2 + 3  # a shorter causal bound, mid-tile
    q32 = torch.randn(requests * per_request, HEADS, 128, device=DEVICE, generator=gen)
    w = torch.randn(requests * per_request, HEADS, device=DEVICE, generator=gen)
    wants, passed = {}, set()
    for fmt, q_dtype, label, cfg in chosen:
        name = _name(fmt, q_dtype, label)
        q = q32.to(q_dtype)
        try:
            got = indexer_score(q, w, pools[fmt], table, req, pos, fmt, context, **cfg).cpu()
            if (fmt, q_dtype) not in wants:
                wants[(fmt, q_dtype)] = reference(q.float().cpu(), w.cpu(), pools[fmt].cpu(), table.cpu(),
                                                  req.cpu(), pos.cpu(), fmt, context)
            want = wants[(fmt, q_dtype)]
            err, same = score_error(torch, got, want)
            tol = TOL_FP8_MMA if (fmt, q_dtype) == ("fp8", torch.float8_e4m3fn) else TOL
            ok = same and err < tol
            status = f"rel err {err:.2e}  {'ok' if ok else 'FAIL'}"
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile or run is a failure, listed
            ok, status = False, f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  check {name:<58s} {status}", flush=True)
        if ok:
            passed.add(name)
        else:
            failures.append(f"{name}: {status}")
    return passed


def time_all(torch, chosen, passed, ceiling):
    """[(shape, name, ms, key TB/s, % copy, TFLOP/s, ratio to the default)] for every passed variant."""
    from dsahal.backends.triton_kernels.indexer import indexer_score

    gen = torch.Generator(device=DEVICE).manual_seed(5)
    blocks = max(r * -(-c // BLOCK_TOKENS) for _, r, _, c in shapes())
    started = time.time()
    pools = {fmt: build_pool(torch, fmt, blocks, gen) for fmt in ("fp8", "mxfp4")}
    print(f"  pools: {blocks} blocks of {BLOCK_TOKENS} keys ({time.time() - started:.1f} s)", flush=True)
    rows = []
    for shape, requests, per_request, context in shapes():
        table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
        tokens = requests * per_request
        q32 = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen)
        w = torch.randn(tokens, HEADS, device=DEVICE, generator=gen)
        out = torch.empty(tokens, context, device=DEVICE)
        visible = float((pos.double() + 1).sum())  # (token, key) pairs under the causal bound
        default_ms = {}
        for fmt, q_dtype, label, cfg in chosen:
            name = _name(fmt, q_dtype, label)
            if name not in passed:
                continue
            q = q32.to(q_dtype)
            try:
                ms = timing.bench_ms(lambda: indexer_score(q, w, pools[fmt], table, req, pos, fmt, context, out=out,
                                                           **cfg), DEVICE, warmup=5, rep=40)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                rows.append((shape, name, None, None, None, None, f"{type(exc).__name__}: {str(exc)[:80]}"))
                continue
            if label == "backend default":
                default_ms[(fmt, q_dtype)] = ms
            tbps = requests * context * pools[fmt].shape[2] / (ms * 1e-3) / 1e12
            tflops = visible * HEADS * 128 * 2 / (ms * 1e-3) / 1e12
            ratio = default_ms.get((fmt, q_dtype), float("nan")) / ms
            rows.append((shape, name, ms, tbps, 100 * tbps / ceiling, tflops, f"{ratio:.2f}x"))
        print(f"  {shape} done ({time.time() - started:.0f} s)", flush=True)
    return rows


def main(argv=None) -> int:
    global DEVICE, BLOCK_TOKENS
    if smoke_args(__doc__.splitlines()[0], argv).cpu_smoke:
        DEVICE, BLOCK_TOKENS = "cpu", 16
    torch, triton, started, ceiling = start("indexer_sweep", DEVICE)
    failures: list[str] = []
    chosen = variants(torch)
    print("\nchecks against the float64 reference")
    passed = check(torch, chosen, failures)
    print(f"\ntiming ({time.time() - started:.0f} s)", flush=True)
    rows = time_all(torch, chosen, passed, ceiling)
    print(f"\n| shape | variant | ms | key TB/s | % copy | TFLOP/s | vs default |\n|---|---|---|---|---|---|---|")
    for shape, vname, ms, tbps, pct, tflops, ratio in rows:
        if ms is None:
            print(f"| {shape} | {vname} | - | - | - | - | failed: {ratio} |")
        else:
            print(f"| {shape} | {vname} | {ms:.3f} | {tbps:.2f} | {pct:.1f} | {tflops:.0f} | {ratio} |")
    return finish("indexer_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("indexer_sweep", main)
