"""MXFP4 (68 B) keys on the block-tile indexer (``backends/triton_kernels/indexer_decode.py``): the decode
modes of ``indexer_decode.MXFP4_MODES`` and the word decode of its ``ALU_FLAGS`` 8 / 16 (with 4) against the
backend defaults (mode 4 with the word decode, alu 12, for FP8 q; the same with bf16 queries split into two e4m3
parts, alu 140, since the eighteenth session) and FP8 (132 B) keys, checked and timed in the same run.

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/mxfp4_indexer_sweep.py [--cpu-smoke]

Steps, in order, each printed:

1. the device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. every variant against the float64 reference (``dsahal.reference.indexer``) on fresh random keys and
   queries (never zeros): a small paged case (3 requests x 5 tokens at 1000 keys, an unmapped block, a
   shorter causal bound mid-tile) on all rows, and the bench shape (64 requests x 5 tokens at 128K keys)
   on the rows of 3 requests (the reference runs one token at a time; every score depends on its own
   token only). Relative (norm) error and the -inf mask; FP8 MMAs at 5e-4 (Hopper's FP8 accumulator),
   the rest at 1e-4;
3. timing (``timing.bench_ms``, do_bench median) of the variants that passed at 64 x 1 and 64 x 5 tokens
   at 128K keys, 32 heads, 64-token blocks: one table with ms, unique key bytes / time (GB/s and % of the
   copy ceiling) and the ratio to the MXFP4 backend default on the same shape.

The floor on key bytes at 64 requests x 128K: 570 MB of MXFP4 keys, 0.134 ms at 4.25 TB/s.

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
"""
from __future__ import annotations

import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from score_check import score_error  # scripts/h200/score_check.py
from script_cli import finish, keep_traceback, run, smoke_args, start  # scripts/h200/script_cli.py
from indexer_gluon_cases import check_gluon, launch_as_backend, paged_case  # scripts/h200/indexer_gluon_cases.py

HEADS = 32
BLOCK_TOKENS = 64
TOL = 1e-4
TOL_FP8_MMA = 5e-4
TOL_HEAD_SUM_MMA = 1e-3  # the head sums as tf32 MMAs: each relu'd score truncated to tf32 (indexer_alu_sweep.py)
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1
# the block-tile launch the backend uses (backends/nvidia/config.py _BLOCK_TILES), for every new mode
TILES = dict(block_n=64, group=5, tiles=16, loop=1, num_warps=4, num_stages=1)
# indexer_decode.ALU_FLAGS sums for MXFP4 keys: 8 int32-word loads and word-wise decode, 16 word-order dims,
# 4 no division (the tile is one cache block)
WORD_ALU = (12, 24, 28)


def shapes():
    """[(label, requests, tokens per request, keys per request)]."""
    if DEVICE == "cpu":
        return [("2x1 @48", 2, 1, 48), ("2x5 @48", 2, 5, 48)]
    return [("64x1 @128K", 64, 1, 128 * 1024), ("64x2 @128K", 64, 2, 128 * 1024), ("8x1 @1M", 8, 1, 1024 * 1024),
            ("64x5 @128K", 64, 5, 128 * 1024),
            ("1x4096 @32K", 1, 4096, 32 * 1024)]  # (twenty-seventh session: the chunked prefill, MMA-bound)


def variants(torch):
    """[(keys, q dtype, label, kind, kwargs)]: kind "backend" runs ``indexer_score`` with the backend's
    configuration (kwargs), "mode" runs ``indexer_decode.launch`` with ``mxfp4_mode`` and ``dot`` (kwargs).
    The MXFP4 backend default comes first: the ratio column is to it."""
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels import indexer_decode

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    # registers per thread in the sm_90 compile (local Triton 3.9, 4 warps, 5-token segments, one tile
    # prefetched) in brackets: <= 168 keeps 3 programs on an SM, above that 2; none spills. Main-loop SASS
    # instructions per 64-key tile (python -m dsahal.backends.nvidia.aot --only mxfp4 --sass) in braces
    if DEVICE == "cpu":  # interpreter: bf16 dots are wrong there; exact fp32 dots or FP8 queries instead
        small = dict(block_n=16, group=2, tiles=2)
        tiles = dict(small, block_tiles=True, group=8, tiles=2, tile_loop=1)
        exact, tiny = indexer_decode.DOT_FP32, dict(TILES, block_n=16, tiles=2)
        return [("mxfp4", fp8, "backend default (dot_scaled)", "backend", dict(tiles, mxfp4_dot_scaled=True)),
                ("fp8", fp8, "FP8 keys, backend default", "backend", dict(tiles, typed_keys=True)),
                ("mxfp4", torch.float32, "mode 1", "mode", dict(tiny, mxfp4_mode=1, dot=exact)),
                ("mxfp4", torch.float32, "mode 2", "mode", dict(tiny, mxfp4_mode=2, dot=exact)),
                ("mxfp4", fp8, "mode 4", "mode", dict(tiny, mxfp4_mode=4, dot=indexer_decode.DOT_BF16)),
                ("mxfp4", torch.float32, "mode 5", "mode", dict(tiny, mxfp4_mode=5, dot=exact))] + [
                ("mxfp4", fp8, f"mode 4, alu {alu}", "mode",
                 dict(tiny, mxfp4_mode=4, alu=alu, dot=indexer_decode.DOT_BF16)) for alu in WORD_ALU] + [
                ("mxfp4", fp8, "mode 4, alu 28, two tiles ahead", "mode",
                 dict(tiny, mxfp4_mode=4, alu=28, loop=3, dot=indexer_decode.DOT_BF16)),
                ("mxfp4", torch.float32, "mode 2, alu 28", "mode", dict(tiny, mxfp4_mode=2, alu=28, dot=exact)),
                ("mxfp4", bf16, "mode 4, alu 140 (bf16 q as e4m3 hi/lo)", "mode",
                 dict(tiny, mxfp4_mode=4, alu=140, dot=indexer_decode.DOT_BF16))]
    dot = indexer_decode.DOT_BF16
    return [("mxfp4", bf16, "backend default (bf16 q)", "backend", dict(indexer_config(HEADS, bf16, "mxfp4"))),
            ("fp8", fp8, "FP8 keys, backend default", "backend", dict(indexer_config(HEADS, fp8, "fp8"))),
            ("fp8", bf16, "FP8 keys, backend default", "backend", dict(indexer_config(HEADS, bf16, "fp8"))),
            ("mxfp4", fp8, "backend default (FP8 q)", "backend", dict(indexer_config(HEADS, fp8, "mxfp4"))),
            # (tl.dot_scaled, modes 2 / 4 with alu 12 / 24 / 28, two tiles ahead, 32 tiles: timed in the ninth
            # session, BENCHMARKS.md; the defaults are mode 4 + alu 12 for FP8 q and mode 3 + alu 12 for bf16 q)
            # tenth session: the launch's 16..64 tiles by programs and the L2 hint (prefetch.global.L2, 4 tiles ahead)
            # (mode 4 / 3 with alu 12, FP8 / bf16 q: no longer timed since the twenty-sixth session, BENCHMARKS.md)
            # (sixteenth session: alu flag 64, the PTX score stores, slower for MXFP4 keys: FP8 q 0.458 / 1.025 ms
            # against alu 12's 0.440 / 0.966 at 64x1 / 64x5)
            # eighteenth session: alu flag 128, bf16 queries split into e4m3 hi + lo for mode 4's FP8 MMAs (two a
            # block) instead of mode 3's fp16 MMAs
            ("mxfp4", bf16, "mode 4, alu 140 (bf16 q as e4m3 hi/lo), 16..64 tiles, L2 hint 4 ahead", "mode",
             dict(TILES, mxfp4_mode=4, alu=140, wide_tiles=64, l2_ahead=4, dot=dot))] + [
            # twentieth session: the Gluon kernel (indexer_gluon, MX): whole 4,352-byte tiles by cp.async, the e2m1
            # codes shifted into e4m3 words in registers and stored as four 32-dim blocks' MMA operands in shared
            # memory, four K = 32 wgmmas a token (A from shared memory), the block scales after; bf16 queries: each
            # row split into e4m3 hi + lo, a block's lo MMA chained onto its hi MMA's accumulator (R4: depth 2 as
            # depth 1 at one token, slower at 2 and 5; through shared memory 0.89x the register operands below,
            # twenty-third session: no longer timed since the twenty-sixth)
            # twenty-third session: the decoded keys as the MMAs' register operands (mx_registers), no shared-memory
            # round trip (sm_90, Triton 3.6: 116 registers, 21.6 KB at 4 stages with FP8 q): the backend's launch
            # (6 stages: no faster, not timed since the twenty-sixth session)
            # twenty-sixth session: each token's head sum as a tf32 MMA (head_sum_mma; sm_90 loop 1,135 / 1,590
            # instructions for 4 tiles at 1 / 2 tokens against 1,231 / 1,772 with FP8 q)
            ("mxfp4", q_dtype, f"gluon, 4 stages, depth {depth}, register operands, head sum MMA", "gluon",
             dict(stages=4, depth=depth, mx_registers=True, head_sum_mma=True))
            for q_dtype in (fp8, bf16) for depth in (1, 2)] + [
            # twenty-ninth session (built on the CPU, first run here): each key's block scales folded into its decoded
            # codes (mx_fold: one accumulator a token, no four-way sum a score; a tile holding a key whose scales span
            # more than 11 binades scored block by block). sm_90 main loop a tile, fast path: 271 / 318 / 478
            # instructions at 1 / 2 / 5 tokens (FP8 q) against 284 / 398 / 753; 79 / 138 / 166 registers against
            # 119 / 136 / 203 (a 128-register cap at 2 tokens: 4 programs a SM, 8 bytes of stack)
            ("mxfp4", q_dtype, f"gluon, 4 stages, depth 1, register operands, head sum MMA, folded scales{cap_label}",
             "gluon", dict(stages=4, depth=1, mx_registers=True, head_sum_mma=True, mx_fold=True, **cap))
            for q_dtype in (fp8, bf16) for cap_label, cap in (("", {}), (", 128 registers", dict(maxnreg=128)))] + [
            # twenty-seventh session: the tl block tiles from 3 tokens a request (the backend's launch there before
            # the twenty-sixth session moved those calls to the Gluon kernel), for the prefill shape it had not timed
            ("mxfp4", q_dtype, "tl block tiles from 3 tokens a request (the default before)", "backend",
             _without_gluon_more(indexer_config(HEADS, q_dtype, "mxfp4"))) for q_dtype in (fp8, bf16)]


def _without_gluon_more(cfg):
    """The backend's configuration with no Gluon launch for calls of more than 2 tokens a request."""
    tiles = {k: v for k, v in cfg["block_tiles"].items() if k != "gluon_more"}
    return dict(cfg, block_tiles=tiles)


def _name(fmt, q_dtype, label):
    return f"{fmt} keys, {str(q_dtype).split('.')[-1]} q, {label}"


def _call(torch, variant, q, w, pages, table, req, pos, context, out):
    """One launch of ``variant`` -> ``[T, context]`` fp32 scores (in ``out``)."""
    from dsahal.backends.triton_kernels import indexer_decode
    from dsahal.backends.triton_kernels.indexer import indexer_score, run_offsets

    fmt, _, _, kind, cfg = variant
    if kind == "gluon":  # segments of the call's tokens a request, as the backend's route
        return launch_as_backend(q, w, pages, table, req, pos, context, out, index_fmt=fmt, **cfg)
    if kind == "backend":
        return indexer_score(q, w, pages, table, req, pos, fmt, context, out=out, **cfg)
    return indexer_decode.launch(q, w, pages, table, req, pos, run_offsets(req), fmt, context, out, **cfg)


def build_pool(torch, fmt, blocks, gen):
    return cache_pools.index_pool(torch, fmt, blocks, gen, DEVICE, BLOCK_TOKENS)


def inputs(torch, requests, per_request, context, blocks, gen):
    """:func:`pools.decode_batch` on this script's device and block size."""
    return cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE, BLOCK_TOKENS)


def check_case(torch, chosen, case, label, rows, failures, passed):
    """Every variant on one case against the float64 reference on the token rows ``rows`` (the reference
    runs on the device holding the case, one token at a time)."""
    from dsahal.reference.indexer import indexer_score as reference

    pools, table, req, pos, context, q32, w = case
    wants = {}
    for variant in chosen:
        fmt, q_dtype, vlabel, _, _ = variant
        name = _name(fmt, q_dtype, vlabel)
        q = q32.to(q_dtype)
        try:
            out = torch.empty(q.shape[0], context, device=DEVICE)
            got = _call(torch, variant, q, w, pools[fmt], table, req, pos, context, out)[rows]
            key = (fmt, q_dtype)
            if key not in wants:
                wants[key] = reference(q[rows].float(), w[rows], pools[fmt], table, req[rows], pos[rows], fmt,
                                       context)
            err, same = score_error(torch, got, wants[key])
            # (hi/lo: bf16 queries through Hopper's FP8 accumulator, as the backend's bf16-q defaults since the
            # eighteenth session)
            fp8_mma = (q_dtype == torch.float8_e4m3fn and "dot_scaled" not in vlabel) or "hi/lo" in vlabel or (
                q_dtype == torch.bfloat16 and variant[3] == "backend")
            # (the backend's Gluon launches take the head-sum MMAs: every MXFP4 one, FP8 keys' from 3 tokens a request)
            head_sum = "head sum" in vlabel or variant[3] == "backend"
            tol = TOL_HEAD_SUM_MMA if head_sum else TOL_FP8_MMA if fp8_mma else TOL
            ok = same and err < tol
            status = f"rel err {err:.2e}{'' if same else ', -inf mask differs'}  {'ok' if ok else 'FAIL'}"
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile or run is a failure, listed
            keep_traceback(f"mxfp4_indexer_sweep-{label}")
            ok, status = False, f"{type(exc).__name__}: {str(exc)[:300]}"
        print(f"  check {label:<12s} {name:<72s} {status}", flush=True)
        if not ok:
            passed.discard(name)
            failures.append(f"{label}: {name}: {status}")


def bench_pools(torch):
    """The bench shapes' key pools (both formats, enough blocks for the largest), built once per run."""
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    blocks = max(r * -(-c // BLOCK_TOKENS) for _, r, _, c in shapes())
    started = time.time()
    pools = {fmt: build_pool(torch, fmt, blocks, gen) for fmt in ("fp8", "mxfp4")}
    print(f"  pools: {blocks} blocks of {BLOCK_TOKENS} keys ({time.time() - started:.1f} s)", flush=True)
    return pools, blocks


def check(torch, chosen, big, failures):
    """The small paged case on all rows, then the bench shape on 3 requests' rows (keys from ``big``, the
    bench pools) -> the names that passed."""
    passed = {_name(fmt, q_dtype, label) for fmt, q_dtype, label, _, _ in chosen}
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    requests, per_request, context = (3, 5, 1000) if DEVICE == "cuda" else (2, 5, 40)
    blocks = 64 if DEVICE == "cuda" else 8
    pools = {fmt: build_pool(torch, fmt, blocks, gen) for fmt in ("fp8", "mxfp4")}
    table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
    table[0, table.shape[1] // 2] = -1  # an unmapped block
    pos[per_request] = context // 2 + 3  # a shorter causal bound, mid-tile
    tokens = requests * per_request
    q32 = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen)
    w = torch.randn(tokens, HEADS, device=DEVICE, generator=gen)
    rows = torch.arange(tokens, device=DEVICE)
    check_case(torch, chosen, (pools, table, req, pos, context, q32, w), "small", rows, failures, passed)
    del pools
    _, requests, per_request, context = shapes()[-1]
    pools, blocks = big
    table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
    tokens = requests * per_request
    q32 = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen)
    w = torch.randn(tokens, HEADS, device=DEVICE, generator=gen)
    picked = torch.tensor([0, requests // 2, requests - 1], device=DEVICE)  # first, middle, last request
    rows = (picked[:, None] * per_request + torch.arange(per_request, device=DEVICE)).flatten()
    check_case(torch, chosen, (pools, table, req, pos, context, q32, w), "bench shape", rows, failures, passed)
    return passed


def check_gluon_shapes(torch, failures):
    """The Gluon kernel on MXFP4 keys beyond the sweep's check cases: other head counts (8, 16, 20, 64), blocks of 128
    and 256 tokens (tiles inside a block), a token short of its request's run, an unmapped block, a causal bound
    mid-tile, keys at extreme block scales (2^-127, 2^-120, 2^60), FP8 and bf16 queries, against the float64
    reference."""
    def extreme_scales(pages):
        pages[1, :, 64] = 0  # the first 32 dims of a cache block's keys at 2^-127 (UE8M0 byte 0, subnormal) ...
        pages[2, :, 65] = 7  # ... at 2^-120 ...
        pages[3, :, 67] = 187  # ... and at 2^60

    def judge(got, want, tol=TOL_FP8_MMA):
        err, same = score_error(torch, got, want)
        return same and err < tol, f"rel err {err:.2e}{'' if same else ', -inf mask differs'}"

    gen = torch.Generator(device=DEVICE).manual_seed(17)
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    for heads, block_tokens, requests, per_request, context, group, q_dtype in (
            (16, 64, 2, 3, 700, 3, fp8), (20, 128, 3, 5, 1000, 5, fp8), (64, 128, 2, 2, 900, 2, fp8),
            (32, 256, 2, 8, 1500, 5, fp8), (8, 64, 4, 1, 333, 1, fp8), (32, 64, 5, 2, 777, 2, fp8),
            (20, 128, 3, 5, 1000, 5, bf16), (64, 64, 2, 2, 900, 2, bf16), (32, 64, 5, 1, 700, 1, bf16)):
        q, w, pages, table, req, pos, out = paged_case(torch, "mxfp4", heads, block_tokens, requests, per_request,
                                                       context, q_dtype, gen, DEVICE, extreme_scales)
        name = (f"gluon mxfp4, {str(q_dtype).split('.')[-1]} q, {heads} heads, {block_tokens}-token blocks, "
                f"{requests}x{per_request}, group {group}")
        for registers in (False, True):  # the decoded keys through shared memory, and as register operands
            check_gluon(torch, name + (", register operands" if registers else ""), (q, w, pages, table, req, pos),
                        context, out, group, judge, failures, index_fmt="mxfp4", tiles=2, wide_tiles=None,
                        mx_registers=registers)
        for depth in (1, 2):  # the head sums as tf32 MMAs (twenty-sixth session)
            out.fill_(float("nan"))
            check_gluon(torch, f"{name}, register operands, head sum MMA, depth {depth}",
                        (q, w, pages, table, req, pos), context, out, group,
                        lambda got, want: judge(got, want, TOL_HEAD_SUM_MMA), failures,
                        index_fmt="mxfp4", tiles=2, wide_tiles=None, mx_registers=True, head_sum_mma=True,
                        depth=depth)
        # the folded scales (twenty-ninth session): blocks 1-3 hold keys spanning more than 11 binades (their tiles
        # scored block by block), the others fold
        out.fill_(float("nan"))
        check_gluon(torch, f"{name}, register operands, head sum MMA, folded scales", (q, w, pages, table, req, pos),
                    context, out, group, lambda got, want: judge(got, want, TOL_HEAD_SUM_MMA), failures,
                    index_fmt="mxfp4", tiles=2, wide_tiles=None, mx_registers=True, head_sum_mma=True, mx_fold=True)
    check_fold_nan(torch, gen, failures)


def check_fold_nan(torch, gen, failures):
    """The folded scales' NaN scale byte (255, OCP MX's NaN: the reference's scores of such keys are NaN): a block
    of keys whose bytes are 255 and 250-254 (within the fold's span: the folded path's NaN factor) and a block with
    255 beside 127 (wider: scored block by block), FP8 and bf16 queries; NaN exactly where the reference has it,
    the rest within the head-sum MMA's bound."""
    def nan_scales(pages):  # blocks 0-7 of the pool (of 24: some are in every request's table)
        pages[0:8:2, :, 64:68] = torch.tensor([255, 250, 252, 254], dtype=torch.uint8, device=pages.device)
        pages[1:8:2, :, 64:68] = torch.tensor([127, 255, 127, 126], dtype=torch.uint8, device=pages.device)

    def judge(got, want):
        nan = torch.isnan(want)
        if not nan.any():
            return False, "the reference has no NaN score: the case missed its NaN keys"
        if not torch.equal(torch.isnan(got), nan):
            return False, f"NaN at {int(torch.isnan(got).sum())} scores, the reference at {int(nan.sum())}"
        err, same = score_error(torch, torch.where(nan, 0.0, got), torch.where(nan, 0.0, want))
        return same and err < TOL_HEAD_SUM_MMA, f"{int(nan.sum())} NaN as the reference, rel err {err:.2e}"

    for q_dtype in (torch.float8_e4m3fn, torch.bfloat16):
        q, w, pages, table, req, pos, out = paged_case(torch, "mxfp4", 32, 64, 2, 2, 600, q_dtype, gen, DEVICE,
                                                       nan_scales)
        check_gluon(torch, f"gluon mxfp4 folded scales, NaN scale bytes, {str(q_dtype).split('.')[-1]} q",
                    (q, w, pages, table, req, pos), 600, out, 2, judge, failures, index_fmt="mxfp4", tiles=2,
                    wide_tiles=None, mx_registers=True, head_sum_mma=True, mx_fold=True)


def time_all(torch, chosen, passed, ceiling, big):
    """[(shape, name, ms, key GB/s, % copy, ratio to the MXFP4 default)] for every passed variant, on
    fresh block tables and queries over the bench pools ``big``."""
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    pools, blocks = big
    started = time.time()
    rows = []
    for shape, requests, per_request, context in shapes():
        table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
        tokens = requests * per_request
        q32 = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen)
        w = torch.randn(tokens, HEADS, device=DEVICE, generator=gen)
        out = torch.empty(tokens, context, device=DEVICE)
        peer = None
        for variant in chosen:
            fmt, q_dtype, label, _, _ = variant
            name = _name(fmt, q_dtype, label)
            if name not in passed:
                continue
            q = q32.to(q_dtype)
            try:
                ms = timing.bench_ms(lambda: _call(torch, variant, q, w, pools[fmt], table, req, pos, context, out),
                                     DEVICE, warmup=5, rep=40)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                rows.append((shape, name, None, None, None, f"{type(exc).__name__}: {str(exc)[:80]}"))
                continue
            peer = ms if peer is None and fmt == "mxfp4" and "backend default" in label else peer
            gbps = requests * context * pools[fmt].shape[2] / (ms * 1e-3) / 1e9
            ratio = f"{peer / ms:.2f}x" if peer is not None else "-"
            rows.append((shape, name, ms, gbps, 100 * gbps / (ceiling * 1e3), ratio))
        print(f"  {shape} done ({time.time() - started:.0f} s)", flush=True)
    return rows


def main(argv=None) -> int:
    global DEVICE, BLOCK_TOKENS
    if smoke_args(__doc__.splitlines()[0], argv).cpu_smoke:
        DEVICE, BLOCK_TOKENS = "cpu", 16
    torch, triton, started, ceiling = start("mxfp4_indexer_sweep", DEVICE)
    failures: list[str] = []
    chosen = variants(torch)
    big = bench_pools(torch)
    print("\nchecks against the float64 reference")
    passed = check(torch, chosen, big, failures)
    if DEVICE != "cpu":  # (Gluon has no interpreter)
        check_gluon_shapes(torch, failures)
    print(f"\ntiming ({time.time() - started:.0f} s)", flush=True)
    rows = time_all(torch, chosen, passed, ceiling, big)
    print("\n| shape | variant | ms | key GB/s | % copy | vs MXFP4 default |\n|---|---|---|---|---|---|")
    for shape, vname, ms, gbps, pct, ratio in rows:
        if ms is None:
            print(f"| {shape} | {vname} | - | - | - | failed: {ratio} |")
        else:
            print(f"| {shape} | {vname} | {ms:.3f} | {gbps:.0f} | {pct:.1f} | {ratio} |")
    return finish("mxfp4_indexer_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("mxfp4_indexer_sweep", main)
