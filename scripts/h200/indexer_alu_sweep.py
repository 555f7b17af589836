"""Block-tile indexer on FP8 keys: the instruction-count options (``indexer_decode.ALU_FLAGS``, launcher
``alu``) against the backend default, checked and timed in the same run on one Hopper GPU.

Usage (on a CUDA machine, from the repository root with dsahal importable)::

    python3 scripts/h200/indexer_alu_sweep.py [--cpu-smoke]

Why: at 64 x 1 tokens x 128K keys the default ran at 54% of DRAM peak with the integer ALU the busiest
pipe (Nsight Compute, eighth session); its sm_90 SASS spends ~200 of 420 instructions per 64-key tile
unpacking and repacking key bytes. The flags (see the module docstring of indexer_decode): 1 int32-word
key loads, 2 the FP8 MMA's register layout as the load layout, 4 no division per tile (whole-block tiles).

Steps, in order, each printed:

1. the device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. every variant on a small paged case (3 requests x 5 tokens at 1000 keys, an unmapped block, a causal
   bound mid-tile, 32 heads, 64-token blocks in a random permutation) against the float64 reference (on
   the CPU): relative error and the -inf mask; FP8 MMAs at 5e-4 (Hopper's FP8 accumulator), bf16 at 1e-4;
3. timing (``triton.testing.do_bench`` median) of the variants that passed at 64 x 1, 64 x 2, 64 x 5
   tokens at 128K keys and 8 x 1 at 1M, FP8 (132 B) keys, FP8 and bf16 queries. One table: ms, unique key
   bytes / time (TB/s, % of the copy ceiling) and the ratio to the backend default on the same shape.

Variants other than the default call ``indexer_decode.launch`` with the default's block-tile parameters
and the changes their label names (``indexer_score`` does not forward ``alu`` yet). A failed check is
listed and the script exits with one ``error:`` line (after timing what did pass).
"""
from __future__ import annotations

import os
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from score_check import score_error  # scripts/h200/score_check.py
from script_cli import finish, run, smoke_args, start  # scripts/h200/script_cli.py
from indexer_gluon_cases import check_gluon, launch_as_backend, paged_case  # scripts/h200/indexer_gluon_cases.py

HEADS = int(os.environ.get("SWEEP_HEADS", "32"))  # index heads (DeepSeek-V3.2's indexer has 64)
BLOCK_TOKENS = 64
TOL = 1e-4
TOL_FP8_MMA = 5e-4
# the head sums as tf32 MMAs (head_sum_mma): each relu'd score truncated to tf32 by the MMA (up to 2^-10 of it, 2^-11
# on average, always toward zero) on top of the FP8 MMA's error: 5.2-6.4e-4 measured (R1, twenty-sixth session)
TOL_HEAD_SUM_MMA = 1e-3
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1


def shapes():
    """[(label, requests, tokens per request, keys per request)]."""
    if DEVICE == "cpu":
        return [("2x1 @48", 2, 1, 48), ("2x5 @48", 2, 5, 48)]
    k = 1024
    return [("64x1 @128K", 64, 1, 128 * k), ("64x2 @128K", 64, 2, 128 * k), ("64x5 @128K", 64, 5, 128 * k),
            ("8x1 @1M", 8, 1, 1024 * k), ("1x4096 @32K", 1, 4096, 32 * k)]  # (the last: a chunked prefill, MMA-bound)


def variants(torch):
    """[(q dtype, label, launch changes or None for the backend default)]. Registers per thread and SASS
    instructions per 64-key tile (one token; each further token of a segment ~80-97 more) in the sm_90 AOT
    compile with the local Triton 3.9, FP8 q, 4 warps, 5-token segments, in brackets (default [134, 420])."""
    fp8 = torch.float8_e4m3fn
    # (the eighth session's first run timed alu 7, alu 6 without prefetch and alu 7 two tiles ahead too: slower
    # than alu 5 at every shape; alu 5 is the backend default since)
    # (the backend default: alu 5 with 5-token segments, as "alu 5, 5-token segments" by the direct launch)
    # (ninth session, BENCHMARKS.md: 32 / 64 tiles a program, 8 warps, two tiles ahead, alu 37 / 39 for bf16 q;
    # 64 tiles was the fastest, 0.337 ms at 64x1, but a compile-time count then)
    # tenth session: the tile count at run time (one compile), the launch's choice of 16..64 by its programs
    # (indexer_decode.tiles_per_program), and the L2 hint (prefetch.global.L2 on the tile l2_ahead tiles ahead:
    # more bytes in flight with no registers held; AOT [registers]: alu 5 114, with the hint 118)
    # thirteenth session: segments of the call's tokens per request (the launcher's group_per_request) instead of
    # 5: a compile per segment length, fewer registers at 1-2 tokens (sm_90 AOT, Triton 3.9: FP8 q 104 / 120 / 118
    # registers at 1 / 2 / 5 tokens, so 4 programs per SM either way; bf16 q 123 / 127 / 142, so 4 programs per SM
    # at 1-2 tokens instead of 3)
    # fifteenth session: alu flag 64 (each token's scores stored by PTX from the head sum's register layout, no
    # shared-memory conversion and its two barriers; sm_90 AOT, 5-token FP8 q: 12 -> 2 barriers a tile, 118 -> 114
    # registers) is in the backend default; "alu 5" is the default before it, by the direct launch
    # sixteenth session: ptxas's register cap (maxnreg 96: 5 programs of 4 warps a SM instead of 4; sm_90 AOT, Triton
    # 3.6, FP8 q: 2-token segments 106 -> 94 registers, no spill, 256 -> 278 loop instructions; 5-token 116 -> 96 with
    # 64 B of spills) and segments of the call's tokens per request (a compile per length)
    # (sixteenth session: segments of the request's tokens became the default, FP8 q from 2 tokens a request, bf16
    # q always; maxnreg 96 spilled at 5 tokens and prefill)
    # eighteenth session: alu flag 128, bf16 queries split into e4m3 hi + lo (two FP8 MMAs a token on the e4m3 keys,
    # no widening of the keys to bf16 each tile), the bf16-q default since R1 (1.23-1.42x at 1-2 tokens a request);
    # "keys widened" is the default before it; the hi and lo MMAs in separate accumulators since R2 (chained, the
    # FP8 accumulator's precision cost 4.3e-4 relative error against 1.3e-4 for FP8 queries)
    now = dict(alu=69, wide_tiles=64, l2_ahead=4)
    out = [(fp8, "backend default", None), (torch.bfloat16, "backend default (hi/lo, alu 197)", None)]
    # (eighteenth session, R2: "keys widened to bf16 (alu 69)", the bf16-q default before the hi/lo split, 0.70x /
    # 0.81x / 0.94x / 0.64x / 0.97x the split's time at 64x1 / 64x2 / 64x5 / 8x1 / prefill; R4: the L2 hint 4 tiles
    # ahead, the FP8-q default before, 0.97-0.98x at 1-2 tokens, 0.92x at 5 and prefill)
    # nineteenth session: the Gluon kernel (indexer_gluon: whole tiles by 16-byte cp.async into shared memory, every
    # token's wgmma issued before the first epilogue). R1: one buffer for all stages (three barriers a tile), 4 stages
    # 1.07x / 1.04x / 0.72x the default at 1 / 2 / 5 tokens, 226 registers at 5. R2: a buffer a stage (one barrier a
    # tile), token MMAs in flight bounded ("depth"), weights in shared memory: 3 stages 1.09x / 1.03x / 0.90x / 1.09x
    # / 0.93x at 64x1 / 64x2 / 64x5 / 8x1 / prefill (90.7% of copy at 64x1), 4 stages 1.03x / 1.06x (79.3% at 64x2)
    # / 0.79x; depth 8 as depth 2 but slower at 5 tokens (0.79x); 2 stages 1.05x / 1.03x / 0.90x. R3: bf16 queries
    # split into hi + lo parts (two MMAs a token, as the tl kernel's flag 128)
    # (R3: bf16 q 4 stages 1.06x at 1 token, 3 stages 1.11x at 2, 0.99-1.02x at 5; depth 1 no better.) Since R4 the
    # backend's default at <= 2 tokens a request is the Gluon kernel (config._FP8_Q_GLUON, _BF16_Q_GLUON): the tl
    # block tiles there, the default before, are timed by the direct launch below. (R6: key chunks balanced to whole
    # waves by the compiled kernel's resident programs: no gain beyond the run's 3-5% spread; removed)
    if DEVICE != "cpu":  # (Gluon has no interpreter)
        # the tl block tiles as the backend ran them before the Gluon kernel took the call (the L2 hint at <= 2
        # tokens a request only)
        out += [(fp8, "tl block tiles (the default before)", dict(now, group="backend", l2_ahead="backend"))]
        # twentieth session, R1: stages of 8,448 bytes exactly (a padded [2048]-word buffer, two copies a tile of 512
        # and 16 pieces; sm_90, Triton 3.6: FP8 q 2 tokens 4 stages 42.2 KB against 74.0 KB, 5 programs a SM instead of
        # 3) against the 16 KiB stages: 3-6 stages timed, 5 the fastest for FP8 q (1.01x / 1.08x / 1.01x at 64x1 /
        # 64x2 / 8x1), 5 / 4 for bf16 q (1.07x / 1.09x / 1.07x); the 16 KiB stages removed, the new counts the default
        # twenty-first session: 5 tokens a request as segments of at most 2 (2 + 2 + 1) or 1 token, each segment a
        # Gluon program reading the request's key tiles (the L2 serving the repeats), against the tl kernel's one
        # 5-token segment (45.6% of copy). R7 / R9: slower, 0.748 / 0.853 ms against 0.572 with FP8 q (every segment's
        # copies are L2 requests, the L2 already 84-91% busy at 1-2 tokens); not routed
        # twenty-fifth session, R1: FP8 queries, 2 or 4 tokens of a segment as one MMA (token_stack: their heads side
        # by side on the N side, DeepGEMM's operand layout; sm_90, Triton 3.6, 5-token segments: 8 QGMMA a tile
        # instead of 20, 168 registers) 0.598-0.615 ms at 64x5 against 0.615-0.626 one MMA a token (4 / 5 stages, 3
        # programs a SM); one MMA a token at depth 1 under a 128-register cap (4 programs a SM) 0.559, prefill 1.647
        # against the tl kernel's 1.831: since then the backend's launch from 3 tokens a request (config.gluon_more).
        # R2: its neighbours, and 8-token segments for the prefill (fewer tile reads a token)
        # (R2, 32 heads: depth 1 / 2, 3 / 4 stages, 120 / 128 / 160 registers, 8-token segments for FP8 q: within
        # 1-3% of the default at 5 tokens and prefill, 8-token segments 0.88-0.98x; bf16 q at depth 1 1.08x / 1.13x
        # the depth-2 default then, so depth 1 since.) R4, 64 heads (DeepSeek-V3.2's indexer): no register cap
        # (168 registers; 128 spilled 64 bytes there), fewer stages (the queries' shared memory doubles)
        # (R4 at 64 heads, BENCHMARKS.md: the 33-64-head launches of config._FP8_Q_GLUON_WIDE / _BF16_Q_GLUON_WIDE.)
        # R9, 32 heads: five programs a SM at 5 tokens (2 stages, 38.5 KB, a 96-register cap: 56 bytes spilled, 9
        # reloads and 478 loop instructions a tile against the default's 436, sm_90, Triton 3.6); 104 registers (4
        # programs, the control) and the default's neighbour at 3 stages (not timed since: BENCHMARKS.md)
        # twenty-sixth session: each token's head sum as a tf32 MMA (head_sum_mma: relu(scores) as the register A
        # operand of a N = 8 wgmma against the segment's weights; sm_90, Triton 3.6, 32 heads, 5 tokens: 1,303 loop
        # instructions for 4 tiles against 1,745, 64 heads 1,309 against 1,848), at the backend's launches and more
        bf16 = torch.bfloat16
        # (R1-R3: "default, head sum MMA", the backend's launches with it; since R3 the default from 3 tokens a request
        # at <= 32 heads, and with FP8 q at 33-64: the default before is timed here)
        out += [(dt, "default before (no head sum MMA)", dict(backend_more=dict(head_sum_mma=False)))
                for dt in (fp8, bf16)]
        # (R2: each head sum waited on at once; R3: a token's scores stored after the next one's head sum is issued,
        # depth 1 issuing the next token's MMAs first, depth 2 the head sum first)
        # (R3: depth 1 at 3 stages and under a 120-register cap, depth 2 at 3-4 stages: within 4%, not taken)
        # twenty-seventh session: warp-specialised (warp_specialized: one producer warp copying each tile and
        # signalling its stage on an mbarrier, the warpgroup scoring; no CTA barrier a tile). 8 warps a program (the
        # producer's warpgroup padded), so maxnreg is the launch's registers: 80 -> 3 programs a SM, the consumers
        # 136 registers (sm_90, Triton 3.6: no spill at depth 1; bf16 q stacked needs 152: 88 -> 2 programs a SM).
        # R1 (every variant checked first): FP8 q 0.522 / 0.524 ms at 64x5 with 4 / 6 stages against the default's
        # 0.504 (0.96-0.97x), 0.97-0.99x at 64x1 / 64x2 / 8x1 / prefill; head sums not as MMAs 0.79x; bf16 q 0.88x
        # (two programs a SM). The consumer loop is 301 instructions a tile against 327: not routed
        out += [(fp8, f"gluon, warp-specialised, depth 1, {s} stages, {r} registers, head sum MMA",
                 dict(gluon=True, stages=s, depth=1, maxnreg=r, head_sum_mma=True, warp_specialized=True))
                for s, r in ((6, 80),)]
        out += [(bf16, f"gluon, stacked, warp-specialised, depth 1, {s} stages, {r} registers, head sum MMA",
                 dict(gluon=True, stacked=True, stages=s, depth=1, maxnreg=r, head_sum_mma=True,
                      warp_specialized=True, producer_regs=24))
                for s, r in ((6, 88),)]
    return out


def _name(q_dtype, label):
    return f"fp8 keys, {str(q_dtype).split('.')[-1]} q, {label}"


def _runner(torch, q_dtype, changes, per_request):
    """A function of (q, w, pages, table, req, pos, width, out) running this variant."""
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels import indexer_decode
    from dsahal.backends.triton_kernels.indexer import indexer_score, pick_dot, run_offsets

    cfg = dict(indexer_config(HEADS, q_dtype, "fp8"))
    if changes is not None and "backend_more" in changes:  # the backend's routing with these gluon_more options
        tile = cfg["block_tiles"]
        cfg["block_tiles"] = dict(tile, gluon_more=dict(tile["gluon_more"], **changes["backend_more"]))
        changes = None
    if changes is not None and changes.get("gluon"):  # the Gluon kernel (indexer_gluon), segments as the backend's
        def gluon(q, w, pages, table, req, pos, width, out):
            return launch_as_backend(q, w, pages, table, req, pos, width, out,
                                     **{k: v for k, v in changes.items() if k != "gluon"})
        return gluon
    if DEVICE == "cpu":  # 16-token blocks in the smoke run
        cfg["block_tiles"] = dict(cfg["block_tiles"], block_n=16, tiles=2)
    if changes is None:
        return lambda q, w, pages, table, req, pos, width, out: indexer_score(
            q, w, pages, table, req, pos, "fp8", width, out=out, **cfg)
    tile = dict(cfg["block_tiles"])
    kwargs = dict(dot=pick_dot(q_dtype, "fp8"), block_n=tile["block_n"], group=tile.get("tile_group", 5),
                  tiles=tile["tiles"], loop=tile.get("tile_loop", 1), num_warps=tile["num_warps"],
                  num_stages=tile["num_stages"], typed_keys=tile.get("typed_keys", False))
    kwargs.update(changes)
    if kwargs.get("l2_ahead") == "backend":  # the hint at <= 2 tokens a request (config._FP8_KEYS_L2)
        kwargs["l2_ahead"] = 2 if per_request <= 2 else 0
    if kwargs["group"] == "backend":  # as the backend's group_per_request (indexer._request_group)
        from dsahal.backends.triton_kernels.indexer import _request_group

        kwargs["group"] = _request_group(tile.get("tile_group", 5), per_request, 1, tile.get("group_per_request"))
    return lambda q, w, pages, table, req, pos, width, out: indexer_decode.launch(
        q, w, pages, table, req, pos, run_offsets(req), "fp8", width, out, **kwargs)


def inputs(torch, requests, per_request, context, blocks, gen):
    """:func:`pools.decode_batch` on this script's device and block size."""
    return cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE, BLOCK_TOKENS)


def check(torch, chosen, failures):
    """Every variant against the float64 reference on a small paged case -> the names that passed."""
    from dsahal.reference.indexer import indexer_score as reference

    gen = torch.Generator(device=DEVICE).manual_seed(3)
    requests, per_request, context = (3, 5, 1000) if DEVICE == "cuda" else (2, 5, 40)
    blocks = 64 if DEVICE == "cuda" else 8
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, BLOCK_TOKENS)
    table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
    table[0, table.shape[1] // 2] = -1  # an unmapped block
    pos[per_request] = context // 2 + 3  # a shorter causal bound, mid-tile
    q32 = torch.randn(requests * per_request, HEADS, 128, device=DEVICE, generator=gen)
    w = torch.randn(requests * per_request, HEADS, device=DEVICE, generator=gen)
    wants, passed = {}, set()
    for q_dtype, label, changes in chosen:
        name = _name(q_dtype, label)
        q = q32.to(q_dtype)
        try:
            out = torch.full((q.shape[0], context), float("nan"), device=DEVICE)  # unwritten scores fail
            got = _runner(torch, q_dtype, changes, per_request)(q, w, pages, table, req, pos, context, out).cpu()
            if q_dtype not in wants:
                wants[q_dtype] = reference(q.float().cpu(), w.cpu(), pages.cpu(), table.cpu(), req.cpu(), pos.cpu(),
                                           "fp8", context)
            want = wants[q_dtype]
            err, same = score_error(torch, got, want)
            # (FP8 MMAs: FP8 queries, and bf16 ones split into hi/lo, through Hopper's FP8 accumulator)
            # (the backend's launches from 3 tokens a request, and the check case's 5, take the head-sum MMAs)
            head_sum = "head sum" in label and "no head sum" not in label or label.startswith("backend default")
            tol = TOL if "widened" in label else TOL_HEAD_SUM_MMA if head_sum else TOL_FP8_MMA
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


def check_gluon_shapes(torch, failures):
    """The Gluon kernel beyond the sweep's check case: other head counts (8, 16, 20, 64), blocks of 128 and 256 tokens
    (tiles inside a block), a token short of its request's run, against the float64 reference."""
    gen = torch.Generator(device=DEVICE).manual_seed(11)
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    for heads, block_tokens, requests, per_request, context, group, q_dtype, *stack in (
            (16, 64, 2, 3, 700, 3, fp8), (20, 128, 3, 5, 1000, 5, fp8), (64, 128, 2, 2, 900, 2, fp8),
            (32, 256, 2, 8, 1500, 5, fp8), (8, 64, 4, 1, 333, 1, fp8), (20, 128, 3, 5, 1000, 5, bf16),
            (64, 64, 2, 2, 900, 2, bf16), (32, 64, 5, 1, 700, 1, bf16),
            # tokens stacked on the MMA's N side (token_stack): 16 heads x 4, 64 heads x 2 (128 columns), a padded
            # unit (3 tokens as 4), segments short of their group (3 tokens a request in groups of 5), 8-token groups
            (16, 64, 2, 3, 700, 3, fp8, 4), (8, 128, 3, 5, 1000, 5, fp8, 4), (64, 128, 2, 2, 900, 2, fp8, 2),
            (32, 256, 2, 8, 1500, 5, fp8, 4), (20, 64, 3, 3, 800, 5, fp8, 4), (32, 64, 2, 8, 1100, 8, fp8, 4),
            (32, 64, 3, 5, 1000, 5, fp8, 2)):
        q, w, pages, table, req, pos, out = paged_case(torch, "fp8", heads, block_tokens, requests, per_request,
                                                       context, q_dtype, gen, DEVICE)
        stack = stack[0] if stack else 1
        name = (f"gluon, {str(q_dtype).split('.')[-1]} q, {heads} heads, {block_tokens}-token blocks, "
                f"{requests}x{per_request}, group {group}" + (f", {stack} tokens a MMA" if stack > 1 else ""))

        def judge(got, want, tol=TOL_FP8_MMA):
            err, same = score_error(torch, got, want)
            return same and err < tol, f"rel err {err:.2e}"
        check_gluon(torch, name, (q, w, pages, table, req, pos), context, out, group, judge, failures, tiles=2,
                    wide_tiles=None, **({"token_stack": stack} if stack > 1 else {}))
        if stack == 1:  # the head sums as tf32 MMAs (twenty-sixth session), at depth 1 and 2
            for depth in (1, 2):
                out.fill_(float("nan"))
                check_gluon(torch, f"{name}, head sum MMA, depth {depth}", (q, w, pages, table, req, pos), context,
                            out, group, lambda got, want: judge(got, want, TOL_HEAD_SUM_MMA), failures, tiles=2,
                            wide_tiles=None, head_sum_mma=True, depth=depth,
                            stacked=q_dtype == bf16)
            for hsum in (True, False):  # warp-specialised (twenty-seventh session), 3 stages: wrapping phases
                out.fill_(float("nan"))
                check_gluon(torch, f"{name}, warp-specialised, head sum MMA {hsum}", (q, w, pages, table, req, pos),
                            context, out, group, lambda got, want: judge(got, want, TOL_HEAD_SUM_MMA), failures,
                            tiles=5, wide_tiles=None, head_sum_mma=hsum, depth=1, stages=3, stacked=q_dtype == bf16,
                            warp_specialized=True, maxnreg=96)


def check_gluon_nan(torch, failures):
    """A bf16 query row holding NaN on the Gluon kernel: the reference's scores are NaN on that token's visible keys
    (relu(NaN) sums to NaN) and so must the kernel's be (the e4m3 parts would hide it: the row's weight factor is NaN,
    as the tl kernel's; a row holding Inf gives NaN there too, where the reference may give +-Inf); the other tokens'
    scores as the reference's."""
    gen = torch.Generator(device=DEVICE).manual_seed(13)
    requests, per_request, context, heads = 3, 2, 500, 32
    blocks = requests * -(-context // 64) + 2
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, 64)
    table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, DEVICE, 64)
    q = torch.randn(requests * per_request, heads, 128, device=DEVICE, generator=gen)
    q[0, 5, 7] = float("nan")
    q = q.to(torch.bfloat16)
    w = torch.randn(requests * per_request, heads, device=DEVICE, generator=gen)
    out = torch.full((q.shape[0], context), 7.0, device=DEVICE)

    def judge(got, want, tol=TOL_FP8_MMA):
        same_nan = torch.equal(torch.isnan(got), torch.isnan(want)) and bool(torch.isnan(want[0]).any())
        rows = [1, 2, 3, 4, 5]  # the rows without NaN in their query
        err, same = score_error(torch, got[rows], want[rows])
        return same_nan and same and err < tol, f"NaN where the reference has NaN: {same_nan}, other rows " \
                                                        f"rel err {err:.2e}"
    check_gluon(torch, "gluon, a bf16 q row holding NaN", (q, w, pages, table, req, pos), context, out, per_request,
                judge, failures, stages=3)
    out.fill_(7.0)
    check_gluon(torch, "gluon, a bf16 q row holding NaN, head sum MMA", (q, w, pages, table, req, pos), context, out,
                per_request, lambda got, want: judge(got, want, TOL_HEAD_SUM_MMA), failures, stages=3, stacked=True,
                head_sum_mma=True)


def time_all(torch, chosen, passed, ceiling):
    """[(shape, name, ms, key TB/s, % copy, ratio to the default)] for every passed variant."""
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    blocks = max(r * -(-c // BLOCK_TOKENS) for _, r, _, c in shapes())
    started = time.time()
    pages = cache_pools.index_pool(torch, "fp8", blocks, gen, DEVICE, BLOCK_TOKENS)
    print(f"  pool: {blocks} blocks of {BLOCK_TOKENS} keys ({time.time() - started:.1f} s)", flush=True)
    rows = []
    for shape, requests, per_request, context in shapes():
        table, req, pos = inputs(torch, requests, per_request, context, blocks, gen)
        tokens = requests * per_request
        q32 = torch.randn(tokens, HEADS, 128, device=DEVICE, generator=gen)
        w = torch.randn(tokens, HEADS, device=DEVICE, generator=gen)
        out = torch.empty(tokens, context, device=DEVICE)
        default_ms = {}
        for q_dtype, label, changes in chosen:
            name = _name(q_dtype, label)
            if name not in passed:
                continue
            q = q32.to(q_dtype)
            fn = _runner(torch, q_dtype, changes, per_request)
            try:
                ms = timing.bench_ms(lambda: fn(q, w, pages, table, req, pos, context, out), DEVICE, warmup=5,
                                     rep=40)
            except Exception as exc:  # noqa: BLE001 - reported in the table
                rows.append((shape, name, None, None, None, f"{type(exc).__name__}: {str(exc)[:80]}"))
                continue
            if changes is None and q_dtype not in default_ms:
                default_ms[q_dtype] = ms
            tbps = requests * context * pages.shape[2] / (ms * 1e-3) / 1e12
            ratio = default_ms.get(q_dtype, float("nan")) / ms
            rows.append((shape, name, ms, tbps, 100 * tbps / ceiling, f"{ratio:.2f}x"))
        print(f"  {shape} done ({time.time() - started:.0f} s)", flush=True)
    return rows


def main(argv=None) -> int:
    global DEVICE, BLOCK_TOKENS
    if smoke_args(__doc__.splitlines()[0], argv).cpu_smoke:
        DEVICE, BLOCK_TOKENS = "cpu", 16
    torch, triton, started, ceiling = start("indexer_alu_sweep", DEVICE)
    failures: list[str] = []
    chosen = variants(torch)
    print("\nchecks against the float64 reference")
    passed = check(torch, chosen, failures)
    if DEVICE != "cpu":
        check_gluon_shapes(torch, failures)
        check_gluon_nan(torch, failures)
    print(f"\ntiming ({time.time() - started:.0f} s)", flush=True)
    rows = time_all(torch, chosen, passed, ceiling)
    print("\n| shape | variant | ms | key TB/s | % copy | vs default |\n|---|---|---|---|---|---|")
    for shape, vname, ms, tbps, pct, ratio in rows:
        if ms is None:
            print(f"| {shape} | {vname} | - | - | - | failed: {ratio} |")
        else:
            print(f"| {shape} | {vname} | {ms:.3f} | {tbps:.2f} | {pct:.1f} | {ratio} |")
    return finish("indexer_alu_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("indexer_alu_sweep", main)
