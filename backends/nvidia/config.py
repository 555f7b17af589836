"""Block sizes and paths the NVIDIA backend picks for the shared Triton kernels (tuned on an H200).

Every choice depends only on per-row quantities (heads, top-k width, context) and, outside
batch-invariant mode, on the number of rows; with ``DSAHAL_BATCH_INVARIANT=1`` nothing depends on
the number of rows, so a row's result is bitwise the same whatever else is in the batch.
"""
from __future__ import annotations

import functools

import torch

from ..batch_mode import invariant_requested

# The general sparse-MLA kernel at 64+ heads (fp8 per-tensor latents, every format without FlashMLA, batch-invariant
# mode). Default mode splits a row's slots until TARGET_PROGRAMS programs are in flight; batch-invariant mode splits
# every call at INVARIANT_SPLIT slots (a row's result must not depend on the batch). Thirty-fourth session, R1 on an
# H100 (132 SMs, as the H200), scripts/h200/split_sweep.py (every split checked against the unsplit output first; the
# sums of ms over calls of 8, 16, 32, 64, 128, 192 and 320 tokens, 2048 slots): TARGET_PROGRAMS 100 against the old
# 264 (two a SM) fp8_ds_mla 3.441 / 2.238 ms at H = 128 / 64 against 3.630 / 2.274, fp8 2.915 / 1.811 against 3.122 /
# 1.885, bf16 3.311 / 2.109 against 3.470 / 2.103 (200 best at H = 64 by 1-2%); invariant 1024-slot splits against the
# old 512 fp8_ds_mla 3.860 / 2.253 against 4.159 / 2.355, fp8 3.385 / 1.964 against 3.643 / 1.984, bf16 3.638 / 2.122
# against 3.909 / 2.153 (the H200's R1 of the thirty-third session, fp8_ds_mla at 64 x 5 and 64 x 1: 1.08-1.10x too).
TARGET_PROGRAMS = 100
INVARIANT_SPLIT = 1024  # slots per split in batch-invariant mode at 64+ heads, for every batch size
FEW_HEADS_SPLIT = 512  # slots per split of the general kernel below 64 heads, both modes
# The few-heads sparse MLA route (every head of a token in one program) takes calls up to this many
# heads; above it FlashMLA (64/128-head tiles) or the general kernel serve.
SMALL_HEADS_MAX = 32

# The Gluon few-heads kernel's launch (sparse_mla_gluon; the nvidia route "gluon_few_heads", after FlashMLA's), the
# fastest of the H200 sweep (scripts/h200/small_heads_sweep.py --raw-only --gluon, R4 of the sixteenth session, 64 x 5
# tokens x 2048 slots): 16-slot steps, 3 stages, the queries in shared memory and ptxas's cap of 168 registers (three
# programs a SM, no spill): 0.426 / 0.419 ms at H = 16 / 12 against 0.449 / 0.441 with 4 stages and the queries in
# registers (two programs a SM), 0.571 with 32-slot steps, 0.77-0.89 at 8 warps a program; 512-slot splits (batch
# invariant).
GLUON_FEW_HEADS = dict(block_n=16, stages=3, q_smem=True, maxnreg=168, split_size=512)

# The wgmma few-heads kernel (sparse_mla_wgmma; the nvidia route "gluon_wgmma_few_heads", ahead of FlashMLA's): 2
# stages (two programs a SM), 1024-slot splits in both modes (a fixed count: batch invariant), the fastest of the H200
# sweeps at 64 x 5 and 64 x 8 tokens x 2048 slots (scripts/h200/wgmma_mla_check.py, twenty-second session R3: 0.271 ms
# at H = 16; 0.275 with 768-slot splits; twenty-first session: 0.298 with 512; 0.266 since the twenty-fourth
# session's whole-record copies). In default mode it leaves calls of fewer than
# WGMMA_MIN_TOKENS query tokens to FlashMLA's decode where that serves them: GPU time (CUDA-graph replay, R4
# scripts/h200/wgmma_probe.py, H = 16, 2048 slots) 63.5 / 103.5 us against FlashMLA's 76.2 / 113.6 at 64 / 128
# tokens, but 56.8 / 54.2 / 53.2 against 48.4 / 29.1 / 19.9 at 32 / 16 / 8 (too few programs to fill the GPU). With
# 512-slot splits (twice the programs) it measured 42.4 / 66.8 us at 32 / 64 tokens (1.14x FlashMLA at both), 35.5 at
# 16: so in default mode a call of WGMMA_MIN_TOKENS .. 63 query tokens runs with WGMMA_SMALL_SPLITS' smaller
# splits (batch-invariant mode keeps the fixed 1024: a split chosen by batch size would make a
# row's sums depend on its batch). Thirty-sixth session (H100, R4 wgmma_probe.py, the kernel without its tile-scale
# pre-pass, GPU time from CUDA-graph replays, us, FlashMLA / ours at 1024 / 512 / 256-slot splits): 8 tokens 21.4 /
# 48.4 / 29.0 / 20.9, 16 tokens 32.6 / 48.3 / 28.9 / 21.9, 32 tokens 52.7 / 47.9 / 33.0 / 36.6, 64 tokens 80.7 / 51.6 /
# 54.9 / 65.7, 128 tokens 117.5 / 88.5 / 101.1 / 118.6. So the route now takes calls from 16 tokens (16-31 with
# 256-slot splits: 1.49x at 16), 32-63 keep 512-slot splits (1.60x at 32), 64 on 1024 (1.56x at 64); at 8 tokens the
# two tie and FlashMLA's host time is lower: left to it. (Eager calls of < 64 tokens are host-bound on both.)
# Forty-third session: a producer warpgroup gathers (``ws``: the computing warpgroup's step 1,171 instructions a warp
# instead of 1,478, the same results bit for bit), H100 same run (scripts/h200/ws_sweep.py, GPU us, balanced / fixed
# 1024-slot splits, today's launch -> ws with 40 producer registers): H = 16 64 x 5 202.2 -> 197.6 / 229.5 -> 211.2,
# 64 x 8 310.0 -> 302.0 / 322.0 -> 300.9, 128 tokens 96.2 -> 94.6 / 87.6 -> 84.0; H = 12 alike; per-tensor FP8
# 163.7 -> 160.0 / 179.8 -> 176.1.
WGMMA_FEW_HEADS = dict(stages=2, split_size=1024, ws=True, producer_regs=40)
# The wgmma kernels serve a call of more than 16 heads as groups of 16, one program each (every group gathers the
# records again, the L2 serving some: 32 heads cost 1.7-1.9x 16). H200, twenty-fourth session, 64 x 5 tokens x 2048
# slots (scripts/h200/head_groups_check.py), ms, groups against the few-heads Triton kernel (H <= 32) / the general one:
# NVFP4 H = 24 0.390 / 1.506 / 1.723, 32 0.430 / 1.518 / 1.930, 48 0.606 / - / 3.740, 64 0.791 / - / 0.862 (even past
# 64: not measured). The NVFP4 route takes up to this many heads (exact fp16 MMAs on the decoded codes).
WGMMA_GROUPED_MAX_HEADS = 64
# The wgmma few-heads route (gluon_wgmma_few_heads) takes at most this many heads, by record format. Until the
# thirty-seventh session its logits were FP8 MMAs, which accumulate at reduced precision (a logit off by about 2^-13
# of its products' magnitudes): conformance draws with records of magnitudes 1e-3 .. 1e3 ("wide") exceeded the
# suite's bound (a 20-head call, o 5.2e-2 / 4.3e-2, twenty-fourth session R9; a 1-head fp8_ds_mla call in
# batch-invariant mode, 3.6e-2, thirty-seventh R3), so the route took fp8_ds_mla at <= 16 heads only. Its logits are
# fp16 MMAs now (exact operands, full fp32 accumulation: lse within 1e-6 of the reference, the failing draw passes),
# so the limits are speed's. fp8_ds_mla: 16, FlashMLA's decode (heads padded to 64) being faster past that where it
# loads (fp8_ds_mla as groups of 16 at 24 / 32 / 48 heads 0.434 / 0.458 / 0.687 ms on the H200, twenty-fourth session;
# FlashMLA 0.31 ms at 64 heads on an H100). Per-tensor FP8 records (576 bytes, which FlashMLA does not read): 32, the
# most measured (H100, thirty-seventh session R4, scripts/h200/wgmma_fp8_check.py, 64 x 5 tokens x 2048 slots: 0.194 /
# 0.191 / 0.336 ms at H = 16 / 12 / 32, 2.34x / 2.35x / 1.94x the general Triton kernel; 64 x 1 at H = 16 1.27x).
WGMMA_ROUTE_MAX_HEADS = {"fp8_ds_mla": 16, "fp8": 32}
# default mode: (calls of fewer than this many query tokens, their slots a split), the first that holds
WGMMA_SMALL_SPLITS = ((32, 256), (64, 512))
WGMMA_MIN_TOKENS = 16

# The wgmma NVFP4 kernel (sparse_mla_wgmma_fp4; the nvidia route "gluon_wgmma_nvfp4"): 3 stages of 22.5 KB (two
# programs a SM, 221 registers) and a fixed 1024 slots a split in both modes (batch invariant); 512- and 768-slot splits
# measured slower at 64 x 5 / 64 x 8 and 64 x 1 tokens (scripts/h200/wgmma_fp4_check.py, twenty-third session R1, R2).
# In default mode calls of WGMMA_NVFP4_MANY["from_tokens"] or more query tokens run 2 stages under a 168-register cap
# (three programs a SM): 0.2247 / 0.2059 / 0.3422 ms against 0.2340 / 0.2148 / 0.3474 at 64 x 5 (H = 16 / 12) and
# 64 x 8, but 0.1046 against 0.0685 at 64 x 1 (128 programs: one a SM) (R2). The threshold lies between those
# measurements (64 and 320 tokens), not at a measured crossing. Batch-invariant mode keeps the one launch. R9 (same
# run): two logit MMAs in flight at 3 stages (in_flight, 229 registers) 0.2276 / 0.2092 / 0.3410 ms against 0.2340 /
# 0.2151 / 0.3465 with one (1.02-1.03x), the same sums (its checks the same errors to the digit); under the 168-register
# cap it spills, so the three-programs launch keeps one.
# Since the thirty-ninth session default mode takes the balanced schedule (below) from fewer tokens than this launch's
# threshold (3 stages, two programs a SM: 1.05-1.12x this launch at 64 x 5 and 64 x 8), so a call reaches this launch
# only where the balanced schedule is not taken (no device given, a format the table leaves out).
WGMMA_NVFP4 = dict(stages=3, split_size=1024, in_flight=2)
WGMMA_NVFP4_MANY = dict(from_tokens=256, stages=2, maxnreg=168, in_flight=1)
# In default mode calls of few query tokens take smaller splits (more programs): (below this many tokens, slots a
# split), the first that applies. GPU time (CUDA-graph replay, H = 16, 2048 slots, 1M-token pool; twenty-fourth
# session, scripts/h200/fp4_split_probe.py), us at 1024 / 512 / 256-slot splits: 8 tokens 50.0 / 34.7 / 28.3, 16 51.6
# / 35.7 / 34.3, 32 53.3 / 43.3 / 57.0, 64 61.7 / 69.5 / 105.4, 128 94.3 / 128.8 / 191.2. Batch-invariant mode keeps
# the fixed 1024 (a split chosen by batch size would make a row's sums depend on its batch).
WGMMA_NVFP4_SMALL_SPLITS = ((32, 256), (64, 512))
# The balanced schedule (triton_kernels.balanced) of the wgmma kernels, for default mode: as many programs as run at
# once (WGMMA_PROGRAMS_PER_SM a SM: the few-heads kernel's 247 registers and the NVFP4 kernel's 3 stages let two share
# a SM) share a call's 64-slot steps equally, instead of a program a 1024-slot split whose last wave runs part-empty
# (640 programs at 64 x 5 tokens are 2.4 waves of 264 on 132 SMs). WGMMA_BALANCED_FROM_TOKENS: by record format, the
# query-token count from which default mode takes it (a format absent: never). Thirty-ninth session, H100 (every
# launch checked against the reference and every row against the fixed splits first; BENCHMARKS.md). R1
# (scripts/h200/wgmma_mla_check.py, wgmma_fp4_check.py, do_bench ms, fixed / balanced): fp8_ds_mla H = 16 64 x 5 0.2404
# / 0.2156 (1.115x; FlashMLA / ours 1.30x -> 1.45x), H = 12 1.104x, 64 x 8 1.029x, 66 x 4 1.074x; NVFP4 (balanced on
# its 3-stage launch) 64 x 5 0.1886 (168 registers, three a SM) / 0.1794, H = 12 0.1957 / 0.1747, 64 x 8 0.2805 /
# 0.2645, 66 x 3 0.1516 (3 stages) / 0.1227. R2 (scripts/h200/balanced_sweep.py, GPU us from CUDA-graph replays, H = 16,
# n x 2048 slots, fixed / balanced): fp8_ds_mla 64 57.2 / 61.5, 128 90.3 / 98.5, 192 154.0 / 135.5 (1.136x);
# per-tensor FP8 64 47.3 / 52.9, 128 74.7 / 82.3, 192 122.4 / 111.4 (1.099x); NVFP4 64 58.4 / 56.7 (1.03x), 128 79.7 /
# 84.9, 192 139.4 / 112.0 (1.245x). So each format from 192 tokens, the first count measured faster (the crossing lies
# between 128 and 192; NVFP4's small win at 64 is left). Batch-invariant mode keeps the fixed splits whatever this says
# (a piece's split points follow the batch). Forty-first session, H200 (scripts/h200/module_ab.py, GPU ms, fixed /
# balanced): fp8_ds_mla H = 16 64 x 5 0.2210 / 0.1879 (1.176x), 192 0.1503 / 0.1248, 128 0.0856 / 0.0917; NVFP4 64 x 5
# 0.1802 / 0.1725, 192 0.1307 / 0.1129, 128 0.0834 / 0.0855: the same crossing on the H200.
WGMMA_BALANCED_FROM_TOKENS = {"fp8_ds_mla": 192, "fp8": 192, "nvfp4": 192}
WGMMA_PROGRAMS_PER_SM = 2


_batch_invariant: bool | None = None


def batch_invariant() -> bool:
    """``DSAHAL_BATCH_INVARIANT=1``, read once (and again after :func:`read_mode`): route verifiers and
    launchers ask on every call, which must not cost an environment lookup."""
    global _batch_invariant
    if _batch_invariant is None:
        read_mode()
    return _batch_invariant


def read_mode() -> bool:
    """Re-read ``DSAHAL_BATCH_INVARIANT`` (the backend's declaration does, when the registry is built)
    and forget the per-shape configs chosen under the old mode."""
    global _batch_invariant
    _batch_invariant = invariant_requested()
    for cached in _CACHED:
        cached.cache_clear()
    return _batch_invariant


@functools.lru_cache(maxsize=512)
def sparse_mla_config(tokens: int, heads: int, k: int, kv_fmt: str = "bf16",
                      q_dtype: torch.dtype = torch.bfloat16) -> dict:
    """Kernel parameters for ``q [tokens, heads, 576]`` over ``k`` slots per row of ``kv_fmt`` latents.

    Measured on the H200 (2026-11-29, ``python -m dsahal.bench.tune``, 320 tokens, k = 2048):
    H = 128 bf16 1.27 ms at (64 heads, 64 slots, 8 warps, 2 stages) against 1.88 ms for the earlier
    (64, 32, 8, 1) — two stages spill nothing once bf16 latents load through a bf16 view; FP8 latents
    are widened in registers, and one stage measured best there (1.16 ms vs 1.22 ms). H = 16: 0.45 ms
    for both formats (FP8 with three stages) with 512-slot splits.
    Non-bf16 queries take the exact fp32 dots, whose operands are twice as large: small tiles, one
    stage (the bf16 tiles ask for 258-349 KB of shared memory there; the H200 has 227 KB).
    """
    fp8 = kv_fmt != "bf16"
    if q_dtype != torch.bfloat16:
        # 16 heads: with 32, ptxas fell back to 32 registers and an 11 KB stack (python -m dsahal.bench.aot)
        cfg = dict(block_h=16, block_n=16, num_warps=4, num_stages=1)
    elif heads >= 64:
        cfg = dict(block_h=64, block_n=64, num_warps=8, num_stages=1 if fp8 else 2)
    elif heads >= 32:
        cfg = dict(block_h=32, block_n=64, num_warps=4, num_stages=2)
    else:
        cfg = dict(block_h=16, block_n=64, num_warps=4, num_stages=3 if fp8 else 2)
    if heads < 64:
        # Few heads: memory-bound, and the fixed split measured faster on the H200 (H=16, 320 tokens:
        # 0.46 ms vs 0.62 ms unsplit, 2026-11-29), so it is the default there too.
        cfg["split_size"] = FEW_HEADS_SPLIT
        return cfg
    if batch_invariant():
        cfg["split_size"] = INVARIANT_SPLIT
        return cfg
    programs = tokens * -(-heads // cfg["block_h"])
    splits = 1
    while programs * splits < TARGET_PROGRAMS and k // (splits * 2) >= 256:
        splits *= 2
    cfg["split_size"] = None if splits == 1 else -(-k // splits)
    # keep split sizes a multiple of the step so every split but the last is full
    if cfg["split_size"] is not None:
        step = cfg["block_n"]
        cfg["split_size"] = -(-cfg["split_size"] // step) * step
    return cfg


# Block tiles (indexer_decode): one table lookup per 64-key tile, a rolled loop of 16 to 64 tiles (the launch's
# choice by its programs, indexer_decode.tiles_per_program) prefetching the next tile's bytes into registers and
# asking L2 for the tile four ahead, one MMA per query token of a segment of <= 5 tokens (the seed's 1 + 4
# speculative). Tenth session (R1 scripts/h200/indexer_alu_sweep.py, FP8 keys, same run): FP8 q 64x1 / 64x2 /
# 64x5 at 128K, 8x1 at 1M 0.324 / 0.379 / 0.631 / 0.323 ms (81.0% / 69.2% / 41.6% / 81.2% of copy) against
# 16 tiles without the hint 0.345 / 0.390 / 0.647 / 0.343; the hint 2 tiles ahead was slower (0.348 / 0.439 /
# 0.758 / 0.344 without the longer chunks), 8 ahead much slower (0.470 at 64x1); bf16 q 0.532 / 0.678 / 1.095 /
# 0.536 against 0.553 / 0.691 / 1.102 / 0.555. MXFP4 keys (R1 mxfp4_indexer_sweep.py) 64x1 / 64x5: FP8 q 0.441 /
# 0.975 against 0.450 / 1.035, bf16 q 0.653 / 1.541 against 0.662 / 1.682. Neither changes a score's arithmetic.
_BLOCK_TILES = dict(block_n=64, tile_group=5, tiles=16, wide_tiles=64, l2_ahead=4, tile_loop=1, num_warps=4,
                    num_stages=1)
# FP8 keys' ALU flags (indexer_decode.ALU_FLAGS): 1 + 4 (eighth session, below) and 64 (fifteenth session: each
# token's scores stored by PTX from the head sum's own register layout; Nsight Compute had shared-memory waits and
# barriers as the largest stalls, and the local sm_90 SASS of the 5-token kernel goes from 12 to 2 barriers and 10
# to 0 shared-memory accesses a tile, registers 118 -> 114, the same instruction count). H200, R6 of the fifteenth
# session (scripts/h200/indexer_alu_sweep.py, same run, alu 69 against 5): FP8 q 64x1 / 64x2 / 64x5 at 128K, 8x1
# at 1M, 1x4096 at 32K 0.323 / 0.375 / 0.616 / 0.323 / 1.786 ms against 0.322 / 0.384 / 0.617 / 0.323 / 1.805
# (1.00-1.02x); bf16 q 0.515 / 0.653 / 1.046 / 0.516 / 2.941 against 0.530 / 0.669 / 1.089 / 0.531 / 3.089
# (1.02-1.05x). Certified in both modes (indexer_score, dsa_attention, 30 examples). Twenty-third session: flag 64
# dropped. The conformance suite (R5, default mode) found dsa_attention not bitwise repeatable with FP8 index keys at
# 4 index heads and one request of 6-8 tokens; scripts/h200/dsa_repeat_probe.py (R6, R7) traced it to the block-tile
# indexer with flag 64: some entries of a token's score row never written (NaN or stale bytes where the float64
# reference has a score or -inf, in 4 of 4 such cases), and none without it (the same cases, repeatable, errors
# 2.9-4.4e-3 of the reference's largest score). Correct scores first: 1-5% slower at 64x2 / 64x5 by the fifteenth
# session's numbers above.
_FP8_KEYS_ALU = 5
# FP8 keys' L2 hint (indexer._l2_ahead): 2 tiles ahead, and none for calls of more than 2 tokens a request. Eighteenth
# session: Nsight Compute had the L2 the busiest unit at 64x1 / 64x2 (94% / 92%; DRAM 77% / 69%), its requests the
# loads' and the hint's; R4 (scripts/h200/indexer_alu_sweep.py, same run, FP8 q, against 4 tiles ahead): 2 ahead
# 0.318 / 0.351 / 0.318 ms at 64x1 / 64x2 at 128K, 8x1 at 1M against 0.323 / 0.354 / 0.326 (1.01-1.03x), but 0.652
# against 0.618 at 64x5; no hint 0.572 at 64x5 (1.08x) and 1.660 against 1.815 ms at the 4096-token prefill (1.09x),
# 0.335 / 0.361 / 0.335 at 1-2 tokens (0.97-0.98x). MXFP4 keys keep 4 ahead at every length (tenth session: 0.975 vs
# 1.035 ms at 64x5 with it).
_FP8_KEYS_L2 = dict(l2_ahead=2, l2_ahead_tokens=2)
# FP8 keys, calls of <= 2 tokens a request (and more since the twenty-fifth session, gluon_more below): the Gluon
# kernel (indexer_gluon: whole 64-key tiles by 16-byte cp.async
# into shared memory, stages tiles in flight, every token's wgmma issued before the first epilogue), its stage count
# by tokens per request. Nineteenth session, R3 (scripts/h200/indexer_alu_sweep.py, same run, against the tl default):
# FP8 q, 3 stages at 1 token, 4 at 2: 0.289 / 0.332 ms at 64x1 / 64x2 at 128K, 0.289 at 8x1 at 1M (90.7% / 79.0% /
# 90.7% of copy) against 0.316 / 0.349 / 0.316 (1.09x / 1.05x / 1.09x); bf16 q (each row split into e4m3 hi + lo),
# 4 stages at 1 token, 3 at 2: 0.318 / 0.410 / 0.318 (82.4% / 64.0% / 82.6%) against 0.337 / 0.454 / 0.336 (1.06x /
# 1.11x / 1.06x). At 5 tokens and prefill the tl kernel stays faster for FP8 q (Gluon 0.90x / 0.92x) and even for
# bf16 q (0.99-1.02x). Default mode only: a token's score from the Gluon kernel is not bit-equal to the tl kernel's
# (its MMA's k order differs), so a choice by tokens per request would make the score depend on the batch; batch-
# invariant mode keeps the tl kernel for every call. Twentieth session, R1 (the same sweep): stages of 8,448 bytes
# exactly instead of 16 KiB buffers (5 programs a SM instead of 3 at 2 tokens), the counts below the fastest there:
# FP8 q 5 stages 0.287 / 0.306 / 0.287 ms (91.3% / 85.7% / 91.4%) against the 16 KiB stages' best 0.289 / 0.332 /
# 0.291 (1.01x / 1.08x / 1.01x); bf16 q 5 stages at 1 token, 4 at 2: 0.297 / 0.378 / 0.298 (88.2% / 69.5% / 88.0%)
# against 0.318 / 0.411 / 0.318 (1.07x / 1.09x / 1.07x). 64x5: tl 0.572 ms, Gluon's best 0.598 (3 stages).
# Twenty-fifth session (R1 / R2, indexer_alu_sweep.py, same run, every variant checked first): calls of more tokens a
# request (5 a request, prefill) on the Gluon kernel too, one token's MMA in flight, 4 stages and ptxas's cap of 128
# registers (4 programs a SM instead of 3; no spill in the sm_90 compile): 0.559 / 0.558 ms at 64x5 at 128K against
# the tl kernel's 0.612-0.625 / 0.575 (1.03-1.12x; 47.0% of copy), 1.647 / 1.665 at the 4096-token prefill at 32K
# against 1.760-1.831 / 1.673 (1.00-1.11x). Tokens stacked on the MMA's N side (indexer_gluon token_stack: 2 or 4
# tokens a MMA, 8 QGMMA a tile instead of 20) 0.598-0.615 at 64x5: the MMAs are not what bounds it (168 registers, 3
# programs a SM); 8-token segments at prefill 1.664-1.920 (no gain); depth 2 or 3 stages under the cap the same.
# Twenty-sixth session (R3, the same sweep, every variant checked first): from 3 tokens a request each token's head sum
# as a tf32 MMA (indexer_gluon head_sum_mma: relu(scores) as the register A operand of a N = 8 wgmma against the
# segment's weights; sm_90 loop 1,307 instructions for 4 tiles against 1,745): 0.499 ms at 64x5 against 0.561 (1.12x;
# 52.6% of copy), 1.436 at the prefill against 1.611 (1.12x); scores within 4.5-5.2e-4 of the float64 reference
# (normwise) against 1.2-1.4e-4: the MMA truncates each relu'd score to tf32. At 1-2 tokens 1.00-1.02x: not taken there.
_FP8_Q_GLUON = dict(gluon_stages={1: 5, 2: 5}, gluon_more=dict(stages=4, depth=1, maxnreg=128, head_sum_mma=True))
# 33-64 index heads (DeepSeek-V3.2's indexer has 64; a token's queries and accumulators twice as large). Twenty-fifth
# session, R4 (the same sweep at 64 heads, same run, every variant checked first): from 3 tokens a request one token's
# MMA in flight, 3 stages, no register cap (168 registers; the cap of 128 spilled 64 bytes and ran 1.048 ms): 0.880 ms
# at 64x5 at 128K, 2.545 at the 4096-token prefill, against the tl kernel's 0.943 / 2.674 (1.07x / 1.05x); at 2
# tokens 4 stages 0.390 against the 32-head counts' 0.414 (1.06x); 1 token 0.296-0.300 either way (88.5% of copy).
# Twenty-sixth session (R3 at 64 heads): the head sums as tf32 MMAs (above) 0.851 / 2.491 ms at 64x5 / prefill
# against 0.880 / 2.658 (1.03x / 1.07x; the loop 29% shorter, but 3 programs a SM by shared memory and registers).
_FP8_Q_GLUON_WIDE = dict(gluon_stages={1: 5, 2: 4}, gluon_more=dict(stages=3, depth=1, head_sum_mma=True))
# Twenty-second session (R7, scripts/h200/indexer_stack_check.py, same run): bf16 q with a token's hi and lo parts as
# one N = 64 MMA (gluon_stacked; the sm_90 loop 10% shorter at 2 tokens, the same errors on every edge case) 0.3002 /
# 0.3763 / 0.3037 ms at 64x1 / 64x2 / 8x1 against 0.3010 / 0.3838 / 0.3038 (1.00x / 1.02x / 1.00x; 86.8% / 69.2% /
# 85.8% of copy); 5 stages at 2 tokens 0.4056 stacked, 0.4029 not: 4 stays.
# Twenty-fifth session (R2, the same sweep, every variant checked first): at 5 tokens a request and prefill the Gluon
# kernel, hi and lo stacked, 4 stages, one token's MMA in flight (168 registers, 3 programs a SM): 0.825 / 2.366 ms
# against the tl kernel's 0.979 / 2.920 (1.19x / 1.23x; 31.8% of copy at 64x5); two tokens in flight 0.891 / 2.669.
# Twenty-sixth session (R3): the head sums as tf32 MMAs (above) 0.757 / 2.397 ms at 64x5 / prefill against 0.832 /
# 2.364 (1.10x / 0.99x), rel err 5.1-5.6e-4 against 1.2-1.6e-4; at 64 heads 0.99x / 0.94x and at 1-2 tokens 0.93-1.04x:
# taken at <= 32 heads from 3 tokens a request only.
_BF16_Q_GLUON = dict(gluon_stages={1: 5, 2: 4}, gluon_stacked=True,
                     gluon_more=dict(stages=4, depth=1, head_sum_mma=True))
# 33-64 index heads (R4, 64 heads): the stacked hi and lo parts are 128 query rows a token, so fewer stages: 3 at 1-2
# tokens (0.355 / 0.619 ms at 64x1 / 64x2 against 5 / 4 stages' 0.374 / 0.625), 2 from 3 tokens a request (1.445 at
# 64x5, 4.319 at the prefill, against the tl kernel's 1.763 / 5.048: 1.22x / 1.17x; 4 stages held one program a SM,
# 2.660 / 6.373).
_BF16_Q_GLUON_WIDE = dict(gluon_stages={1: 3, 2: 3}, gluon_stacked=True, gluon_more=dict(stages=2, depth=1))
# MXFP4 keys, FP8 or bf16 q (below, indexer_config). Twenty-third session (R4 scripts/h200/mxfp4_indexer_sweep.py, same
# run, every variant checked first, the same errors): the decoded keys as the MMAs' register operands
# (gluon_mx_registers: no shared-memory round trip, no fence or barrier a tile) 0.268 / 0.406 / 0.266 ms at 64x1 /
# 64x2 at 128K and 8x1 at 1M with FP8 q against 0.305 / 0.449 / 0.310 through shared memory (1.10-1.17x; 50.1% /
# 33.1% / 50.6% of copy), bf16 q 0.321 / 0.556 / 0.320 against 0.381 / 0.638 / 0.381 (1.15-1.19x).
# Twenty-sixth session (R5, the same sweep, every variant checked first): each token's head sum as a tf32 MMA
# (gluon_head_sum at 1-2 tokens, gluon_more's head_sum_mma from 3: indexer_gluon head_sum_mma) 0.261 / 0.377 ms at 64x1
# / 64x2 with FP8 q against 0.267 / 0.407 (1.02x / 1.08x; 51.5% / 35.6% of copy), bf16 q 0.308 / 0.551 against 0.321 /
# 0.557 (1.04x / 1.01x); and calls of more tokens a request on the Gluon kernel too (it compiles to 203 / 246
# registers at 5 tokens with them, two programs a SM): 64x5 0.876 / 1.191 against the tl kernel's 1.040 / 1.380 (1.19x
# / 1.16x). Scores within 2.4-5.1e-4 of the float64 reference (keys at extreme block scales included). Twenty-seventh
# session (R2, the same sweep with the prefill shape, 4096 tokens at 32K): 2.598 / 3.469 ms with FP8 / bf16 q against
# the tl kernel's 2.802 / 3.925 (1.08x / 1.13x).
# Twenty-ninth session (R1, the same sweep at ed30c15, every variant checked first): each key's block scales folded
# into its decoded codes (gluon_mx_fold: one accumulator a token; sm_90 main loop 271 / 318 / 478 instructions a tile at
# 1 / 2 / 5 tokens with FP8 q against 284 / 398 / 753): FP8 q 0.261 / 0.356 / 0.629 ms at 64x1 / 64x2 / 64x5 at 128K
# and 1.803 at the prefill (4096 tokens at 32K) against the unfolded launch's 0.260 / 0.378 / 0.869 / 2.571 (1.00x /
# 1.06x / 1.38x / 1.43x; 8x1 at 1M 0.264 against 0.263), bf16 q 0.305 / 0.463 / 1.003 / 2.979 against 0.307 / 0.554 /
# 1.184 / 3.494 (1.01x / 1.20x / 1.18x / 1.17x); scores within 2.4-5.5e-4 of the float64 reference (keys at extreme
# block scales and NaN scale bytes included). A 128-register cap: 0.342 at 64x2 with FP8 q, slower elsewhere: not set.
_MXFP4_GLUON = dict(gluon_stages={1: 4, 2: 4}, gluon_depth=1, gluon_mx_registers=True, gluon_head_sum=True,
                    gluon_mx_fold=True, gluon_more=dict(stages=4, depth=1, head_sum_mma=True))


@functools.lru_cache(maxsize=64)
def indexer_config(heads: int, q_dtype: torch.dtype = torch.bfloat16, index_fmt: str = "fp8") -> dict:
    # H200, 32 heads, FP8 keys (2026-12-01, scripts/h200/indexer_sweep.py, run R1 of the fifth session), block
    # tiles against the general kernel: FP8 q 64x1 / 64x5 at 128K, 8x1 at 1M, 4096 tokens at 32K: 0.482 /
    # 0.801 / 0.484 / 2.298 ms (was 1.654 / 1.988 / 1.654 / 4.245) with the keys fed to the FP8 MMA from
    # registers (typed_keys=False; through shared memory 0.548 / 0.989 / 0.544 / 2.842). bf16 q: 0.671 / 1.244
    # / 0.672 / 3.640 ms (was 1.838 / 2.136 / 1.843 / 3.998). MXFP4 keys, bf16 q, tl.dot_scaled: 1.049 / 1.538
    # / 1.056 / 4.615 ms (was 4.831 / 5.073 / 4.844 / 10.167; the explicit decode 1.275 / 2.529).
    # The rest of each dict is the general kernel's, for the calls the block tiles do not serve (strided or
    # odd-aligned records): its 2026-11-29 choices.
    # MXFP4 keys, FP8 q (sixth session, R3 scripts/h200/mxfp4_indexer_sweep.py): e2m1 shifted into e4m3 exactly,
    # one FP8 MMA per 32-dim scale block, the power-of-two block scale on its result (mxfp4_mode 4): 0.724 /
    # 1.239 ms at 64x1 / 64x5 (18.7% / 10.9% of copy on key bytes; tl.dot_scaled 1.05 / 1.54 in the fifth session).
    # Batch-invariant mode keeps tl.dot_scaled: with mode 4 a token's score differed in its last bit alone vs in
    # a batch of 7 (one of ~240 examples of the suite's property on the H200, R4 of the sixth session).
    # Ninth session (R1 mxfp4_indexer_sweep.py, same run): mode 4 with alu 12 (indexer_decode.ALU_FLAGS 8 + 4:
    # the packed pairs and scale bytes loaded as int32 words and decoded word-wise, no division per whole-block
    # tile) 0.482 / 1.000 ms at 64x1 / 64x5 against mode 4 alone 0.722 / 1.226 (1.50x / 1.23x; 28.0% / 13.5% of
    # copy); the word-order dims (flag 16: alu 24, 28) were slower at both (0.608-0.659 / 1.70-1.82).
    # Twentieth session (R4 mxfp4_indexer_sweep.py, same run): calls of <= 2 tokens a request on the Gluon kernel
    # (indexer_gluon, MX: whole 4,352-byte tiles by cp.async, the codes shifted into e4m3 words and stored as the
    # four blocks' MMA operands in shared memory, four K = 32 wgmmas a token) with 4 stages, one token's MMAs in flight:
    # 0.302 / 0.449 / 0.303 ms at 64x1 / 64x2 at 128K and 8x1 at 1M (44.7% / 30.1% / 44.6% of copy) against mode 4
    # with alu 12's 0.439 / 0.570 / 0.446 (1.45x / 1.27x / 1.47x); at 5 tokens it lost (1.066 against 0.974 ms).
    # Default mode only, as for FP8 keys.
    if index_fmt == "mxfp4" and q_dtype == torch.float8_e4m3fn and not batch_invariant():
        return dict(block_n=64, group=8, tiles=4, num_warps=8, num_stages=1, one_block_tiles=True,
                    mxfp4_dot_scaled=True, block_tiles=dict(_BLOCK_TILES, mxfp4_mode=4, alu=12, **_MXFP4_GLUON))
    # bf16 q (R3 of the ninth session): mode 3 (fp16 MMAs per 32-dim block, scale after) with alu 12, each head's
    # query row scaled into fp16's range by a power of two (indexer_decode._fp16_row_scale: no bf16 value
    # overflows), 0.680 / 1.586 ms at 64x1 / 64x5 against tl.dot_scaled 1.021 / 1.496 (1.50x at one token, 0.94x at
    # five, the one-token decode being the common case); mode 2 (bf16 MMAs) 0.784 / 1.618. Eighteenth session (R3
    # mxfp4_indexer_sweep.py, same run): mode 4 with alu 140 (flag 128: each query row split exactly into e4m3 hi +
    # lo, two FP8 MMAs a block, the low one chained: indexer_decode._e4m3_hi_lo, MXFP4_LO_SCALE) 0.509 / 1.405 ms
    # against mode 3's 0.648 / 1.535 (1.27x / 1.09x; 26.4% / 9.6% of copy), rel err 8.8e-5; certified in both modes.
    # Twentieth session (R6 mxfp4_indexer_sweep.py, same run): calls of <= 2 tokens a request on the Gluon kernel (the
    # same split, a block's lo MMA chained onto its hi MMA's accumulator) with 4 stages, one token in flight: 0.372 /
    # 0.624 / 0.375 ms at 64x1 / 64x2 at 128K and 8x1 at 1M (36.2% / 21.6% / 36.0% of copy) against 0.517 / 0.735 /
    # 0.513 (1.39x / 1.18x / 1.37x), rel err 8.4e-5 as the tl kernel's; 5 tokens 0.98x (tl kept). Default mode only.
    if index_fmt == "mxfp4" and q_dtype == torch.bfloat16 and not batch_invariant():
        return dict(block_n=64, group=8, tiles=4, num_warps=8, num_stages=1, one_block_tiles=True,
                    mxfp4_dot_scaled=True, block_tiles=dict(_BLOCK_TILES, mxfp4_mode=4, alu=140, **_MXFP4_GLUON))
    if index_fmt == "mxfp4" and q_dtype in (torch.bfloat16, torch.float8_e4m3fn):
        return dict(block_n=64, group=8, tiles=4, num_warps=8, num_stages=1, one_block_tiles=True,
                    mxfp4_dot_scaled=True, block_tiles=dict(_BLOCK_TILES))
    # FP8 keys, eighth session (scripts/h200/indexer_alu_sweep.py; Nsight Compute had the integer ALU the busiest
    # pipe, 73%, and the sm_90 SASS ~200 of 420 instructions per one-token tile in byte unpacking and repacking):
    # alu 5 (indexer_decode.ALU_FLAGS: the key bytes loaded as int32 words and split in-thread, no division per
    # whole-block tile; 184 instructions) FP8 q 64x1 / 64x2 / 64x5 at 128K, 8x1 at 1M: 0.385 / 0.487 / 0.673 /
    # 0.382 ms (68% / 54% / 39% / 69% of copy) against 0.485 / 0.559 / 0.797 / 0.485 in the same run (1.15-1.27x);
    # bf16 q 0.605 / 0.741 / 1.134 / 0.599 against 0.676 / 0.824 / 1.256 / 0.670 (1.11-1.12x). Certified in both
    # modes (indexer_score, dsa_attention, 200 examples). block_tiles' group_per_request (segments of at most the
    # call's tokens per request, a compile per length), sixteenth session R1 (scripts/h200/indexer_alu_sweep.py, same
    # run, against 5-token segments): FP8 q 64x2 at 128K 0.361 vs 0.378 ms (1.05x; 72.2% of copy) but 1-token
    # calls slower (64x1 0.345 vs 0.324, 8x1 at 1M 0.345 vs 0.326), so from 2 tokens a request on; bf16 q faster at
    # 1 and 2 tokens (64x1 0.483 vs 0.512, 64x2 0.566 vs 0.667 (1.18x), 8x1 0.484 vs 0.521), so always. 5-token calls
    # and prefill keep 5-token segments either way. (Before: one run, R8 of the thirteenth session, had given times
    # inconsistent with its other runs; ptxas's cap of 96 registers for 5 programs a SM: 1.00-1.02x at 1-2 tokens
    # with bf16 q, spills and 0.48-0.85x at 5 tokens and prefill, not used.)
    if q_dtype == torch.float8_e4m3fn and index_fmt == "fp8":
        gluon = {} if batch_invariant() else (_FP8_Q_GLUON if heads <= 32 else _FP8_Q_GLUON_WIDE)
        return dict(block_n=64, group=8, tiles=16, num_warps=8, num_stages=2, pipeline=True, typed_keys=True,
                    one_block_tiles=False, block_tiles=dict(_BLOCK_TILES, typed_keys=False, alu=_FP8_KEYS_ALU,
                                                            group_per_request=2, **_FP8_KEYS_L2, **gluon))
    # bf16 q: _FP8_KEYS_ALU + 128 (indexer_decode.ALU_FLAGS: each head's query row split exactly into e4m3 hi + lo,
    # two FP8 MMAs a token on the e4m3 keys instead of one bf16 MMA on keys widened every tile; the two into separate
    # accumulators, FP8_KEYS_LO_SCALE). Eighteenth session, R5 (indexer_alu_sweep.py, same run, with _FP8_KEYS_L2,
    # against the seventeenth session's default, alu 69): 64x1 / 64x2 / 64x5 at 128K, 8x1 at 1M, 4096-token prefill
    # at 32K 0.337 / 0.455 / 0.968 / 0.339 / 2.829 ms against 0.487 / 0.565 / 1.031 / 0.496 / 2.949 (1.45x / 1.24x /
    # 1.07x / 1.46x / 1.04x; 77.7% of copy at 64x1), rel err 1.3e-4 as FP8 queries (the widened keys 7e-8); at 5
    # tokens and prefill the MMAs bound it (two FP8 MMAs cost one bf16 MMA). Certified in both modes. Ninth session (R4): alu 37 (flag 32, fp16 MMAs on row-scaled queries) was slower everywhere,
    # 0.636 / 0.843 / 1.454 / 0.641 ms at 64x1 / 64x2 / 64x5 / 8x1 against alu 5's 0.562 / 0.700 / 1.090 / 0.567.
    if q_dtype == torch.bfloat16 and index_fmt == "fp8":
        gluon = {} if batch_invariant() else (_BF16_Q_GLUON if heads <= 32 else _BF16_Q_GLUON_WIDE)
        return dict(block_n=64, group=8, tiles=4, num_warps=4, num_stages=1, one_block_tiles=True,
                    block_tiles=dict(_BLOCK_TILES, typed_keys=True, alu=_FP8_KEYS_ALU | 128, group_per_request=True,
                                     **_FP8_KEYS_L2, **gluon))
    # bf16 keys, and fp32/fp16 queries (exact dots): the general kernel only, unrolled x4 at 4 warps with
    # one-block tiles (bf16 q on bf16 keys 0.458 ms at 64x5 x 32K, 2026-11-29)
    return dict(block_n=64, group=8, tiles=4, num_warps=4, num_stages=1, one_block_tiles=True)


# Top-k of indexer scores, k = 2048, by row width (H200, 2026-12-01, scripts/h200/topk_sweep.py on real FP8
# indexer output, run R1b of the fifth session; torch.topk in the same run):
#   320 x 128K: groups (max per 16-entry group, radix over the live groups) 0.190 ms vs torch.topk 0.653 (3.4x),
#               bound 0.246, rows split over 8 programs (the old default) 0.613;
#   4096 x 32K (causal prefill): bound (lane-max lower bound) 0.857 ms vs 1.809 (2.1x), groups 0.868, radix 1.25;
#   320 x 4K:   one program per row 0.047 ms vs 0.112 (2.4x), bound 0.085, groups 0.17.
# Rows of <= 8K (early decode, short prefill): the registers method (the row whole in one program, read once; its
# output the bound method's bit for bit, index order, so both modes take it). H100 (2026-12-05, scripts/h200/
# topk_sweep.py on real FP8 indexer scores, every variant checked first; same run): thirty-fifth session, 320 x 4K
# 0.0299 ms at 4 warps against the one-program radix kernel's 0.0472 (1.58x; the default until then) and the bound
# method's 0.141 (batch-invariant mode's: 4.7x), torch.topk 0.1165 (3.89x), 8 warps 0.0328, 16 warps 0.0456;
# thirty-sixth session (R3, `--short`), 320 x 8K 0.0575 ms at 8 warps against the radix kernel's 0.0704 (1.22x) and
# the bound method's 0.1116 (1.94x), torch.topk 0.1287 (2.24x), 4 warps 0.0938, 16 warps 0.0686; at 320 x 16K the
# registers method lost (16 warps 0.1424 against the bound method's 0.1116): rows past 8K keep the bound method. The
# radix kernel is no longer a default (a launch option of topk.topk).
REGISTERS_TOPK_ROWS = 8192
_TOPK_REGISTERS = dict(method="registers", num_warps=4)
_TOPK_REGISTERS_8K = dict(method="registers", num_warps=8)  # rows of 4K-8K
_TOPK_BOUND = dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4)
_TOPK_GROUPS_BASE = dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4, finish_chunk=1024,
                         finish_warps=8)
# From 64K: the groups method with segment histograms (the first pass and the compaction store each segment's
# histogram, so the per-row threshold and finish kernels each read their rows once fewer) and the compaction's
# prefetch (its next loads issued before each batch's scan). H200, 2026-12-05, scripts/h200/topk_sweep.py, R1 of the
# thirtieth session, real FP8 indexer scores, torch.topk in the same run: 320 x 128K 0.177 ms against 0.191 without
# them (1.08x; 3.74x torch.topk's 0.663); segment histograms alone 0.183, the prefetch alone 0.188. Launch by launch
# (each alone): the threshold 35.2 -> 25.4 us, the finish 41.6 -> 33.5, the first pass 57.3 -> 64.0 (its histograms).
# The bound method (8K-64K) was slower with segment histograms (prefill 4096 x 32K 0.786 ms against 0.755, 320 x 16K
# 0.168 against 0.110): not set there.
_TOPK_GROUPS = dict(_TOPK_GROUPS_BASE, segment_histograms=True, compact_prefetch=True)
# Rows of >= 1M scores (H200, 2026-12-03, scripts/h200/topk_wide_sweep.py, R4 of the thirteenth session, real
# indexer scores): 64-entry groups and 64K-entry segments, 16K group maxima a row instead of 64K for the per-row
# threshold and finish passes: 8 x 1M 0.183 ms against 0.325 with 16-entry groups (1.78x; torch.topk 0.190), 8 x 2
# tokens 0.196 against 0.343 (torch.topk 0.303). At 128K the same groups leave every group live (G k = N) and ran
# 0.36-0.41x the 16-entry default, so it starts where it was measured, at 1M. It keeps the launch measured there
# (the options above are not measured at 1M).
_TOPK_GROUPS_WIDE = dict(_TOPK_GROUPS_BASE, group_size=64, steps=64)
WIDE_TOPK_ROWS = 1 << 20


# The fused indexer -> top-k (the DSA layer, default mode): the Gluon indexer also stores the top-k's group maxima, and
# the groups method skips its first pass (a read of every score). sm_90 compiles (Triton 3.6, thirty-fourth session,
# `python -m dsahal.backends.nvidia.aot --only "indexer Gluon"`): FP8 keys at 32 heads with FP8 queries 64 -> 64
# registers at 1 token a request, 92 -> 107 at 2, 128 (the cap) at 5 with the same 48-56 bytes of stack; bf16
# queries 166 -> 202 at 5 tokens, MXFP4 keys folded 166 -> 197. Measured on an H100 (thirty-fourth session, R1,
# scripts/h200/fused_maxima_check.py, every case checked first: scores, maxima, slots bit for bit; same run), indexer +
# top-k apart -> fused, ms: FP8 q 64 x 1 at 128K 0.503 -> 0.479 (0.95x), 64 x 2 0.539 -> 0.507 (0.94x) (the top-k
# 0.088 -> 0.061 / 0.109 -> 0.071, the indexer +0.003 / +0.006); but from 3 tokens a request (the head sums' MMA
# launch) the indexer's maxima cost more than the pass they save: 64 x 5 0.719 -> 0.820 (indexer 0.521 -> 0.675),
# bf16 q 0.963 -> 1.126, MXFP4 keys 0.827 -> 1.040; the 64 x 5 DSA layer 1.07x / 1.05x slower at H = 128 / 16. So:
# FP8 keys with FP8 queries, at most FUSED_MAXIMA_TOKENS tokens a request. Thirty-fifth session (H100, same script,
# the head-sum launch's maxima now one reduction a tile for the segment's tokens): 64 x 5 indexer + top-k 0.710 ->
# 0.730 (1.03x; bf16 q 1.10x, MXFP4 keys 1.12x), 64 x 1 / 64 x 2 0.548 -> 0.525 / 0.621 -> 0.590; but the DSA layer
# (fp8_ds_mla, the stages apart -> fused) 64 x 1 H = 128 0.906 -> 0.897 (0.99x), H = 16 0.695 -> 0.718 (1.03x),
# 64 x 2 H = 16 0.685 -> 0.722 (1.05x), 64 x 5 1.04x / 1.00x at H = 128 / 16. Those layer times were eager calls,
# host-bound at 64 x 1 and 64 x 2 (the same apart layer read 0.75-0.91 ms across runs). Thirty-sixth session (H100,
# R2, the layer's GPU time from CUDA-graph replays, off / on / on / off averaged, the output bit for bit the same):
# 64 x 1 H = 128 0.637 -> 0.589 (0.925x), H = 16 0.557 -> 0.541 (0.971x), 64 x 2 H = 16 0.637 -> 0.611 (0.960x);
# 64 x 5 1.180 -> 1.178 / 0.955 -> 0.950 with the maxima at every call length (no gain: the head-sum launch's maxima
# cost what the top-k saves). So: on for FP8 keys with FP8 queries at <= 2 tokens a request.
FUSED_GROUP_MAXIMA: frozenset = frozenset({("fp8", torch.float8_e4m3fn)})
FUSED_MAXIMA_TOKENS = 2


def fused_group_maxima(index_fmt: str, q_dtype: torch.dtype, per_request: int) -> bool:
    """Whether the DSA layer asks its indexer for the top-k's group maxima (:data:`FUSED_GROUP_MAXIMA`, calls of at
    most :data:`FUSED_MAXIMA_TOKENS` query tokens a request); batch-invariant mode's indexer (the ``tl`` kernel) never
    makes them."""
    return ((index_fmt, q_dtype) in FUSED_GROUP_MAXIMA and per_request <= FUSED_MAXIMA_TOKENS
            and not batch_invariant())


@functools.lru_cache(maxsize=64)
def topk_config(width: int) -> dict:
    """Kernel and parameters for rows of ``width`` scores. Every method returns the same set (the tie rule), and
    the registers, bound and groups methods, the only ones routed, write it in index order, the same bits (the radix
    method, a launch option, orders the valid entries otherwise, and that order is the sparse-MLA sum's): a row's
    slots never depend on the call's width, in either mode."""
    if width >= WIDE_TOPK_ROWS:
        return _TOPK_GROUPS_WIDE
    if width >= 65536:
        return _TOPK_GROUPS
    if width <= REGISTERS_TOPK_ROWS:
        return _TOPK_REGISTERS if width <= 4096 else _TOPK_REGISTERS_8K
    return _TOPK_BOUND


@functools.lru_cache(maxsize=16)
def kda_decode_config(value_dim: int) -> dict:
    # H200, 32 heads of 128 x 128 fp32 state (2026-12-01, scripts/h200/kda_decode_sweep.py, run R3 of the sixth
    # session, fla 0.6.0 in the same run): the one-step kernel with one scalar state base per program and the
    # row offsets folded into 64-bit immediates (scalar_row: 117 registers, 4 programs per SM, was 151 / 3), 64
    # value columns at 4 warps: B=256 0.274 ms (93.5% of copy on state read + write and inputs, fla 0.366:
    # 1.33x), B=64 0.074 ms (fla 0.089: 1.21x); the recurrent kernel at the same launch 0.300 / 0.077 ms (86%);
    # both reductions in one pass (fused_output) the same time, cache hints slower, 128 columns 0.316, 8 warps 0.395.
    return dict(block_v=64, num_warps=4, scalar_row=True)


@functools.lru_cache(maxsize=16)
def kda_prefill_config(value_dim: int) -> dict:
    # The token-by-token recurrent kernel (route triton_short / triton_recurrent): 64 value columns per program
    # at 4 warps (2026-11-29 tune sweep of the decode launch it shares: 32 columns 10% slower, 128 spilled).
    return dict(block_v=64, num_warps=4)


@functools.lru_cache(maxsize=16)
def kda_chunk_config(value_dim: int, mode: str = "tf32") -> dict:
    """Launch of the chunked KDA prefill (``backends/triton_kernels/kda_chunk.py``) for 16-bit inputs in one
    of its precise operand modes: ``"mixed"`` (route ``triton_chunk_mixed``, the default order's) or
    ``"tf32"`` (``triton_chunk``, forced only).

    H200, 2026-12-01 (seventh session, scripts/h200/kda_chunk_check.py, 32 heads, K = V = 128; fla's chunk_kda
    3.81 ms at 8 x 4096 and 3.38 ms at mixed lengths 128..8192 in the same runs): mixed with tf32x3 pair
    products, 3 stages **3.66 / 3.45 ms** (2 stages 3.76 / 3.52; ieee pair products 4.42 / 4.11); tf32 mode
    tf32x3 2 stages 4.82 / 4.78 (ieee 5.44 / 5.31; 3 stages slower); bf16 operands 2.51 / 2.34 (1.52x fla, but
    below the conformance suite's bound on small rows, so no route); pass A at 8 warps slower (8.6 ms).
    Nsight Compute (ieee pairs): pass A is L1/shared-memory bound (84% of L1/TEX throughput; 255 registers in
    the tf32 mode, 12.5% occupancy), pass B runs one program per SM (shared memory) in the tf32 mode.
    Eighth session (same script, fla 3.81 / 3.37 ms): mixed with **bf16x3** pair products (three bf16 MMAs on a
    hi/lo split: half tf32's operand bytes in pass A's bound shared memory), 3 stages **3.27 / 3.11 ms** (1.16x /
    1.09x fla; tf32x3 3.64 / 3.41 in the same run; 2 stages 3.37 / 3.17), tf32 mode with bf16x3 4.40 / 4.42.
    Fourteenth session (same script, five H200 runs, fla 3.80-3.87 / 3.36-3.43 ms): pass A was 69% of the time
    (2.24 of 3.25 ms) at 247 registers (2 programs a SM); pass B's slab / warps / stages all slower or equal. Pass A
    with its outputs stored as formed and v loaded last (now its only order: 180 registers) under a cap of 168 (3
    programs a SM) 2.87 ms; with the cumulative gate as one MMA (``scan_mma``: ``tl.cumsum`` across warps was the
    costliest step) **2.38 / 2.53 ms with bf16 / fp32 gates (1.60x / 1.53x fla)**, mixed lengths 2.36 / 2.48
    (1.43x / 1.38x); the inverse's products as one tf32 MMA each instead of FMA dots a further ~0.06 ms
    (``inverse="tf32"``; T's rounding stays below the bf16 rounding of w and u it feeds). Every variant passed the
    float64 check at 0.44-0.61 of the suite's per-row bound (bf16 operands throughout: 1.5-4.6x over it). Pass B's
    programs longest sequence first (``longest_first``): mixed lengths 2.29 -> 2.12 / 2.38 -> 2.22 ms. The default
    (R5): 8 x 4096 2.334 / 2.447 ms (1.63x / 1.58x fla), mixed lengths 2.124 / 2.220 (1.59x / 1.54x)."""
    if mode == "mixed":
        return dict(operands="mixed", pair="bf16x3", block_v=64, num_warps=4, num_stages=3, prepare_warps=4,
                    scan_mma=True, inverse="tf32", prepare_maxnreg=168, longest_first=True)
    return dict(operands="tf32", pair="tf32x3", block_v=64, num_warps=4, num_stages=2, prepare_warps=4)


# Per-shape choices are looked up on every call: cached (callers must not mutate the dicts).
_CACHED = (sparse_mla_config, indexer_config, topk_config, kda_decode_config, kda_prefill_config, kda_chunk_config)
