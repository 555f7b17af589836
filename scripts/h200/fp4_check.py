"""FP4 on one Hopper GPU: the NVFP4/MXFP4 cache-write encoders and the indexer on MXFP4 keys, same run.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/fp4_check.py [--context 131072] [--requests 64] [--per-request 5] [--all-variants]

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. encoders: the Triton cache write of latent:nvfp4 and index:mxfp4 (and index:fp8, which the timing
   pools use) byte for byte against ``dsahal.formats``' pack on the CPU, on random values with
   rounding ties, zeros, ``-0.0``, subnormals, saturating magnitudes and the e4m3 / UE8M0 scale ends,
   fp32 and bf16 inputs, into strided pages inside a larger pool whose other bytes must not change;
   then once captured in a CUDA graph and replayed on new values;
3. the indexer on MXFP4 keys (every variant timed below, and the exact fp32-query path) against the
   float64 reference on a small paged case with unmapped blocks and causal bounds;
4. timing (``triton.testing.do_bench`` median): ``--requests`` x ``--per-request`` query tokens at
   ``--context`` keys each, 32 heads, 64-token blocks, FP8 (132 B) and MXFP4 (68 B) key pools written by
   the checked encoders from random normal values (never zero), blocks scattered by a random
   permutation; one table of ms, key bytes / time in TB/s and % of the copy ceiling.

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
Runs in under 2 minutes on an H200, most of it Triton compiles.
"""
from __future__ import annotations

import argparse
import sys
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

HEADS = 32
BLOCK_TOKENS = 64
INDEX_TOL = 1e-4  # relative (norm) error vs the float64 reference; exact keys, fp32 accumulation
# FP8 queries on FP8 keys run Hopper's FP8 MMA, whose accumulator keeps fewer mantissa bits than fp32
# (DeepGEMM promotes partial sums for this reason): 1.35e-4 measured on the H200, 2026-12-01.
INDEX_TOL_FP8_MMA = 5e-4
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1



def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=5, rep=40)


# -- step 2: encoders ----------------------------------------------------------------------------------

def edge_values(torch, kind, tokens, gen):
    """``[tokens, dim]`` fp32: random rows with per-block magnitudes spread over the format's range, then
    rows that sit on every rounding rule (e2m1 midpoints at exact scales, scale boundaries, the e4m3
    scale floor and cap, UE8M0's ends, saturation, zeros, ``-0.0``, subnormals)."""
    dim, block = (576, 16) if kind == "latent" else (128, 32)
    nope = 512 if kind == "latent" else 128
    blocks = nope // block
    low, high = (-14, 12) if kind == "latent" else (-60, 60)
    spread = torch.exp2(torch.randint(low, high + 1, (tokens, blocks, 1), generator=gen).float())
    values = torch.randn(tokens, dim, generator=gen)
    values[:, :nope] *= spread.expand(-1, -1, block).reshape(tokens, nope)
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.2, 5.5])
    ties = ties.repeat(block // 16)
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[torch.isfinite(grid)].unique()
    if kind == "latent":  # scales: e4m3 normals, so amax 6·s gives s exactly and x / s hits midpoints
        normal = grid[grid >= 2.0**-6]
        scales = normal[torch.randint(0, normal.numel(), (tokens // 4, blocks), generator=gen)]
        mids = (grid[1:] + grid[:-1]) / 2  # RoPE ties between e4m3 neighbours
        values[: tokens // 4, nope:] = mids[torch.randint(0, mids.numel(), (tokens // 4, 64), generator=gen)]
    else:  # scales: powers of two across UE8M0's range
        scales = torch.exp2(torch.randint(-125, 124, (tokens // 4, blocks), generator=gen).float())
    signs = torch.where(torch.rand(tokens // 4, blocks, block, generator=gen) < 0.5, -1.0, 1.0)
    values[: tokens // 4, :nope] = (ties * signs * scales[:, :, None]).reshape(tokens // 4, nope)
    edge = values[tokens // 4: tokens // 4 + 8]
    edge[0] = 0.0
    edge[1] = -0.0
    edge[2, :nope] = torch.randn(nope, generator=gen) * 1e-39  # fp32 subnormals
    edge[3, :nope] = 3e38 * torch.linspace(-1, 1, nope)  # saturation (both formats)
    edge[4, :nope] = torch.randn(nope, generator=gen) * 1e-7  # below the NVFP4 scale floor
    edge[5, :nope:block] = 1.5 * 2.0**5 * (1 + 2.0**-23)  # one ulp past an MXFP4 scale boundary
    edge[6, :nope:block] = 6.0 * 448.0 * (1 + 2.0**-20)  # past the e4m3 scale cap
    if kind == "latent":
        edge[7, nope:] = torch.tensor([500.0, -1e5, 464.0, -0.0, 3 * 2.0**-10, 2.0**-10, 1e-30, 448.0] * 8)
    return values.float()


def check_encoders(torch, failures):
    from dsahal.backends.triton_kernels.cache_write import cache_write
    from dsahal.formats import cache_format

    gen = torch.Generator().manual_seed(11)
    tokens = 4096 if DEVICE == "cuda" else 24
    for kind, fmt in (("latent", "nvfp4"), ("index", "mxfp4"), ("index", "fp8")):
        if fmt == "fp8" and DEVICE == "cpu":
            print("  check cache_write index:fp8: not run under the interpreter (its float -> e4m3 cast is wrong)")
            continue
        spec = cache_format(kind, fmt)
        values = edge_values(torch, kind, tokens, gen)
        if fmt == "fp8":
            values = torch.randn(tokens, 128, generator=gen) * torch.exp2(torch.randint(-20, 20, (tokens, 1),
                                                                                          generator=gen).float())
        for dtype in (torch.float32, torch.bfloat16):
            source = values.clamp(-3e38, 3e38).to(dtype)
            if DEVICE == "cpu" and dtype == torch.bfloat16:  # the interpreter widens bf16 subnormals wrongly
                source = torch.where(source.float().abs() < 2.0**-126, source * 0, source)
            block_tokens = 16
            num_blocks = -(-tokens // block_tokens) + 2
            stride_t, stride_b = spec.token_bytes + 4, block_tokens * (spec.token_bytes + 4) + 52
            pool = torch.randint(0, 256, (3 + num_blocks * stride_b,), dtype=torch.uint8, generator=gen)
            shape, strides = (num_blocks, block_tokens, spec.token_bytes), (stride_b, stride_t, 1)
            slots = torch.randperm(num_blocks * block_tokens, generator=gen)[:tokens]
            slots[::97] = -1
            want = pool.clone()
            keep = slots >= 0
            want_pages = want.as_strided(shape, strides, 3)
            records = spec.pack(source[keep])
            kept = slots[keep]
            want_pages[kept // block_tokens, kept % block_tokens] = records
            device_pool = pool.to(DEVICE)
            cache_write(source.to(DEVICE), slots.to(DEVICE), device_pool.as_strided(shape, strides, 3), kind, fmt, None)
            got = device_pool.cpu()
            bad_records = int((got.as_strided(shape, strides, 3)[kept // block_tokens, kept % block_tokens]
                               != records).any(dim=1).sum())
            guards_changed = int((got != want).sum()) - int(
                (got.as_strided(shape, strides, 3)[kept // block_tokens, kept % block_tokens] != records).sum())
            ok = bad_records == 0 and guards_changed == 0
            label = f"cache_write {kind}:{fmt} {str(dtype).split('.')[-1]}"
            print(f"  check {label:<38s} {int(keep.sum())} records, {bad_records} differ from pack, "
                  f"{guards_changed} guard bytes changed  {'ok' if ok else 'FAIL'}", flush=True)
            if not ok:
                failures.append(f"{label}: {bad_records} records differ from pack, {guards_changed} guard bytes changed")
    if DEVICE == "cuda":
        check_graph_capture(torch, failures)


def check_graph_capture(torch, failures):
    """The MXFP4 and NVFP4 writes captured in a CUDA graph (no host sync may happen inside) and replayed."""
    from dsahal.backends.triton_kernels.cache_write import cache_write
    from dsahal.formats import cache_format

    for kind, fmt in (("latent", "nvfp4"), ("index", "mxfp4")):
        spec = cache_format(kind, fmt)
        static_values = torch.randn(64, spec.dim, device=DEVICE)
        static_slots = torch.randperm(256, device=DEVICE)[:64]
        pages = torch.zeros(16, 16, spec.token_bytes, dtype=torch.uint8, device=DEVICE)
        cache_write(static_values, static_slots, pages, kind, fmt, None)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                cache_write(static_values, static_slots, pages, kind, fmt, None)
            static_values.copy_(torch.randn(64, spec.dim, device=DEVICE) * 7)
            graph.replay()
            torch.cuda.synchronize()
            flat = pages.view(-1, spec.token_bytes).cpu()
            ok = torch.equal(flat[static_slots.cpu()], spec.pack(static_values.cpu()))
        except Exception as exc:  # noqa: BLE001 - reported as this check's failure
            ok = False
            print(f"  check cache_write {kind}:{fmt} CUDA graph: {type(exc).__name__}: {exc}", flush=True)
        print(f"  check {'cache_write ' + kind + ':' + fmt + ' in a CUDA graph':<38s} replayed on new values  "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"cache_write {kind}:{fmt}: CUDA-graph replay did not write pack's bytes")


# -- steps 3 and 4: indexer ----------------------------------------------------------------------------

def indexer_variants(torch, all_variants):
    """[(keys, q dtype, label, launcher kwargs)]; the backend's own configuration first per (keys, q)."""
    from dsahal.backends.nvidia.config import indexer_config

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    if DEVICE == "cpu":  # interpreter: bf16 tl.dot is wrong there; fp32 decode and dot_scaled are not
        small = dict(block_n=16, group=2, tiles=2)
        return [("mxfp4", torch.float32, "fp32 decode (exact)", dict(small)),
                ("mxfp4", fp8, "dot_scaled", dict(small)),
                ("fp8", fp8, "backend config", dict(small))]
    out = [("fp8", q, "backend config", dict(indexer_config(HEADS, q, "fp8"))) for q in (bf16, fp8)]
    for q in (bf16, fp8):
        cfg = dict(indexer_config(HEADS, q, "mxfp4"))
        out.append(("mxfp4", q, "backend config", cfg))
        out.append(("mxfp4", q, "explicit bf16 decode", dict(cfg, mxfp4_dot_scaled=False)))
        if q == bf16 or all_variants:
            out.append(("mxfp4", q, "dot_scaled fast_math", dict(cfg, mxfp4_fast_math=True)))
            out.append(("mxfp4", q, "dot_scaled pipelined x16", dict(cfg, tiles=16, pipeline=True, num_stages=2)))
        if all_variants:
            out.append(("mxfp4", q, "dot_scaled keys as B", dict(cfg, keys_as_b=True)))
            out.append(("mxfp4", q, "dot_scaled per-key addressing", dict(cfg, one_block_tiles=False)))
            out.append(("mxfp4", q, "dot_scaled 4 warps", dict(cfg, num_warps=4)))
    out.append(("mxfp4", torch.float32, "fp32 decode (exact)", dict(indexer_config(HEADS, torch.float32, "mxfp4"))))
    return out


def build_pool(torch, fmt, blocks, gen):
    return cache_pools.index_pool(torch, fmt, blocks, gen, DEVICE, BLOCK_TOKENS)


def decode_inputs(torch, requests, per_request, context, blocks, gen):
    """:func:`pools.decode_batch` on this script's device and block size."""
    return cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE, BLOCK_TOKENS)


def check_indexer(torch, variants, pools, failures):
    """Every variant on a small case against the float64 reference (on the CPU) -> the set of
    ``(keys, q dtype, label)`` that passed."""
    from dsahal.backends.triton_kernels.indexer import indexer_score
    from dsahal.reference.indexer import indexer_score as reference

    gen = torch.Generator(device=DEVICE).manual_seed(3)
    requests, per_request, context = (3, 5, 1000) if DEVICE == "cuda" else (2, 2, 40)
    blocks = {fmt: pages.shape[0] for fmt, pages in pools.items()}
    table, req, pos = decode_inputs(torch, requests, per_request, context, min(blocks.values()), gen)
    table[0, table.shape[1] // 2] = -1  # an unmapped block
    pos[per_request] = context // 2  # a shorter causal bound
    q32 = torch.randn(requests * per_request, HEADS, 128, device=DEVICE, generator=gen)
    w = torch.randn(requests * per_request, HEADS, device=DEVICE, generator=gen)
    wants, passed = {}, set()
    for fmt, q_dtype, label, cfg in variants:
        pages = pools[fmt]
        q = q32.to(q_dtype)
        name = f"indexer {fmt} keys, {str(q_dtype).split('.')[-1]} q, {label}"
        try:
            got = indexer_score(q, w, pages, table, req, pos, fmt, context, **cfg).cpu()
            if (fmt, q_dtype) not in wants:
                wants[(fmt, q_dtype)] = reference(q.float().cpu(), w.cpu(), pages.cpu(), table.cpu(), req.cpu(),
                                                  pos.cpu(), fmt, context)
            want = wants[(fmt, q_dtype)]
            finite = torch.isfinite(want)
            err = float((got[finite].double() - want[finite].double()).norm() / want[finite].double().norm())
            tol = INDEX_TOL_FP8_MMA if (fmt, q_dtype) == ("fp8", torch.float8_e4m3fn) else INDEX_TOL
            ok = torch.equal(torch.isfinite(got), finite) and err < tol
            status = f"rel err {err:.2e}  {'ok' if ok else 'FAIL'}"
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile or run is a failure, listed
            ok, status = False, f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  check {name:<62s} {status}", flush=True)
        if ok:
            passed.add((fmt, q_dtype, label))
        else:
            failures.append(f"{name}: {status}")
    return passed


def time_indexer(torch, variants, passed, args, ceiling):
    from dsahal.backends.triton_kernels.indexer import indexer_score

    gen = torch.Generator(device=DEVICE).manual_seed(5)
    requests, per_request, context = args.requests, args.per_request, args.context
    blocks = requests * -(-context // BLOCK_TOKENS)
    started = time.time()
    pools = {fmt: build_pool(torch, fmt, blocks, gen) for fmt in ("fp8", "mxfp4")}
    table, req, pos = decode_inputs(torch, requests, per_request, context, blocks, gen)
    tokens = requests * per_request
    q32 = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen)
    w = torch.randn(tokens, HEADS, device=DEVICE, generator=gen)
    out = torch.empty(tokens, context, device=DEVICE)
    print(f"  timing pools: {blocks} blocks of {BLOCK_TOKENS} keys, fp8 {pools['fp8'].numel() / 1e9:.2f} GB, mxfp4 "
          f"{pools['mxfp4'].numel() / 1e9:.2f} GB ({time.time() - started:.1f} s)", flush=True)
    rows = []
    for fmt, q_dtype, label, cfg in variants:
        if (fmt, q_dtype, label) not in passed or (q_dtype == torch.float32 and DEVICE == "cuda"):
            continue  # failed its check, or the exact fp32 path (correctness only, not a speed path)
        q = q32.to(q_dtype)
        key_bytes = requests * context * pools[fmt].shape[2]
        try:
            ms = _bench(lambda: indexer_score(q, w, pools[fmt], table, req, pos, fmt, context, out=out, **cfg))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            rows.append((fmt, q_dtype, label, None, None, None, f"{type(exc).__name__}: {str(exc)[:100]}"))
            continue
        tbps = key_bytes / (ms * 1e-3) / 1e12
        rows.append((fmt, q_dtype, label, ms, tbps, 100 * tbps / ceiling, ", ".join(f"{k}={v}" for k, v in cfg.items())))
        print(f"  {fmt} keys, {str(q_dtype).split('.')[-1]} q, {label}: {ms:.3f} ms, {tbps:.2f} TB/s of keys "
              f"({rows[-1][5]:.1f}% of copy)", flush=True)
    return rows


def _smoke_mode(args) -> None:
    import os

    global DEVICE, BLOCK_TOKENS
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, BLOCK_TOKENS = "cpu", 16
    args.requests, args.per_request, args.context = 2, 2, 48


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=1 << 17, help="keys per request (default 128K)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--per-request", type=int, default=5, help="query tokens per request")
    parser.add_argument("--all-variants", action="store_true", help="also time keys-as-B, per-key addressing, "
                        "4 warps and the fp8-query sweeps (adds compiles: over 2 minutes)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1: runs every step of the script, "
                             "times nothing meaningful")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        _smoke_mode(args)
    for name in ("context", "requests", "per_request"):
        if getattr(args, name) < 1:
            raise CheckError(f"fp4_check: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.per_request > args.context:
        raise CheckError(f"fp4_check: --per-request ({args.per_request}) must be <= --context ({args.context})")
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("fp4_check: needs a CUDA device, none is visible")
    started = time.time()
    import triton

    ceiling = timing.announce(torch, triton, DEVICE)
    failures: list[str] = []
    print("\nencoders against dsahal.formats' pack")
    check_encoders(torch, failures)
    print(f"\nindexer against the float64 reference ({time.time() - started:.0f} s)")
    variants = indexer_variants(torch, args.all_variants)
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    small_blocks = 64 if DEVICE == "cuda" else 8
    pools = {fmt: build_pool(torch, fmt, small_blocks, gen) for fmt in ("fp8", "mxfp4")}
    passed = check_indexer(torch, variants, pools, failures)
    print(f"\nindexer timing: {args.requests} req x {args.per_request} tok at {args.context} keys, {HEADS} heads "
          f"({time.time() - started:.0f} s)", flush=True)
    rows = time_indexer(torch, variants, passed, args, ceiling)
    print(f"\n{'keys':<6s} {'q':<14s} {'variant':<30s} {'ms':>8s} {'key TB/s':>8s} {'%copy':>6s}  config")
    for fmt, q_dtype, label, ms, tbps, pct, cfg in rows:
        q_name = str(q_dtype).split(".")[-1]
        if ms is None:
            print(f"{fmt:<6s} {q_name:<14s} {label:<30s} {'-':>8s} {'-':>8s} {'-':>6s}  failed: {cfg}")
        else:
            print(f"{fmt:<6s} {q_name:<14s} {label:<30s} {ms:8.3f} {tbps:8.2f} {pct:6.1f}  {cfg}")
    return finish("fp4_check", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("fp4_check", main)
