"""Paged lightning-indexer score over bf16 (256 B), FP8 (132 B) or MXFP4 (68 B) index keys.

``score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s]) · k_scale[s]`` for ``s <= positions[t]``,
-inf elsewhere (and on unmapped or out-of-range blocks).

Work unit: a *segment* (up to ``GROUP`` consecutive query tokens of one request; decode puts a
request's 1 + speculative tokens next to each other) times a run of ``TILES`` key tiles of
``BLOCK_N`` positions. The segment's queries form one ``[GROUP · BLOCK_H, 128]`` operand, loaded
once; each key tile is loaded once and multiplied by all of them in a single MMA
(``keys [BLOCK_N, 128] @ Qᵀ``), then relu, head weights and the per-token head sum are applied in
registers. FP8 queries on FP8 keys use the FP8 tensor cores; anything else is widened exactly.

MXFP4 keys are dequantised in the kernel (e2m1 nibbles times ``2^(ue8m0 - 127)`` per 32 dims; every
such value is exact in bf16 and fp32). bf16 and FP8 queries take ``tl.dot_scaled`` by default (the
packed bytes and their UE8M0 scales go to the MMA as an e2m1 operand; Triton upcasts them to bf16 on
Hopper), or, with ``mxfp4_dot_scaled=False``, an explicit decode into bf16 even-dim and odd-dim halves
multiplied by the matching halves of the queries (two K = 64 MMAs, no interleaving of the nibbles).
fp32/fp16 queries take the explicit decode into fp32 (exact dots).

The launcher marks segment starts (``run_offset % GROUP == 0``) with a few sync-free torch ops;
programs of other tokens exit at once.

With ``block_tiles=True`` the calls :func:`.indexer_decode.serves` accepts (FP8 / MXFP4 keys in packed,
aligned pages, bf16 / FP8 queries, key tiles inside one cache block) run its block-tile kernel instead:
one MMA per query token, unmasked tile loads, tiles past a segment's reach skipped.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import grid as launch_grid
from . import indexer_decode
from .alignment import aligned_rows
from .segments import run_offsets, segment_plan  # noqa: F401 (run_offsets: this module's name for it, kept)
from .bytes import (INDEX_CODES, INDEX_MXFP4, e2m1_ue8m0_value, load_f32_bytewise, load_u16_bytewise, typed_views,
                    views_usable, widen_bf16)
from dsahal.kernel_launch import wrap_launched

DOT_BF16 = 0
DOT_FP8 = 1
DOT_FP32 = 2
MAX_SEGMENT_ROWS = 256  # tokens x heads of one segment: the widest Hopper MMA (wgmma N <= 256)


@triton.jit
def _bf16_keys_for_dot(words, DOT: tl.constexpr):
    """Raw bf16 key words (uint16) as the MMA operand type: bf16, or exactly widened to fp32."""
    keys = widen_bf16(words, DOT == 0)
    if DOT == 2:
        keys = keys.to(tl.float32)
    return keys


@triton.jit
def _fp8_keys_for_dot(raw, DOT: tl.constexpr):
    """Raw e4m3 key bytes as the MMA operand type: fp8 (FP8 MMA), or exactly widened to bf16 / fp32."""
    keys = raw.to(tl.float8e4nv, bitcast=True)
    if DOT == 0:
        keys = keys.to(tl.bfloat16)
    elif DOT == 2:
        keys = keys.to(tl.float32)
    return keys


@triton.jit
def _key_tile(pages_u8, s8_b, s8_t, pages_u16, s16_b, s16_t, pages_f32, s32_b, s32_t, block_table_ptr, stride_bt,
              req, tile, s, s_ok, num_blocks, max_blocks, block_tokens, FMT: tl.constexpr, DOT: tl.constexpr,
              TOKEN_BYTES: tl.constexpr, ALIGNED: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """Keys at positions ``s`` [BLOCK_N] (key tile ``tile``) of request ``req`` -> (keys [BLOCK_N, 128],
    scale, mapped).

    When tokens are packed (``TOKEN_BYTES`` > 0, the record size) the token stride is a compile-time
    constant, so the compiler knows each record's alignment (16 B for bf16, 4 B for the 132-byte FP8
    records); otherwise the run-time strides are used.
    """
    if ONE_BLOCK:
        return _one_block_key_tile(pages_u8, s8_b, pages_u16, s16_b, pages_f32, s32_b, block_table_ptr, stride_bt,
                                   req, tile, s, s_ok, num_blocks, max_blocks, FMT, DOT, TOKEN_BYTES)
    dims = tl.arange(0, 128)
    logical = s // block_tokens
    block = tl.load(block_table_ptr + req * stride_bt + logical, mask=s_ok & (logical < max_blocks), other=-1)
    mapped = s_ok & (block >= 0) & (block < num_blocks)
    block = tl.where(mapped, block, 0).to(tl.int64)
    offset = s % block_tokens
    if not ALIGNED:  # records at odd addresses: assemble from bytes through the uint8 view
        raw = pages_u8 + block * s8_b + offset * s8_t
        if FMT == 0:
            keys = _bf16_keys_for_dot(load_u16_bytewise(raw[:, None] + 2 * dims[None, :], mapped[:, None]), DOT)
            scale = tl.full(s.shape, 1.0, tl.float32)
        else:
            keys = _fp8_keys_for_dot(tl.load(raw[:, None] + dims[None, :], mask=mapped[:, None], other=0), DOT)
            scale = load_f32_bytewise(raw + 128, mapped)
    elif FMT == 0:
        if TOKEN_BYTES > 0:
            row = block * s16_b + offset * (TOKEN_BYTES // 2)
        else:
            row = block * s16_b + offset * s16_t
        keys = _bf16_keys_for_dot(tl.load(pages_u16 + row[:, None] + dims[None, :], mask=mapped[:, None], other=0), DOT)
        scale = tl.full(s.shape, 1.0, tl.float32)
    else:
        if TOKEN_BYTES > 0:
            row = block * s8_b + offset * TOKEN_BYTES
            row32 = block * s32_b + offset * (TOKEN_BYTES // 4)
        else:
            row = block * s8_b + offset * s8_t
            row32 = block * s32_b + offset * s32_t
        # (other=0.0: the pointer may be the fp8-typed view, which takes no integer fill value)
        keys = _fp8_keys_for_dot(tl.load(pages_u8 + row[:, None] + dims[None, :], mask=mapped[:, None], other=0.0), DOT)
        scale = tl.load(pages_f32 + row32 + 32, mask=mapped, other=0.0)
    return keys, scale, mapped


@triton.jit
def _one_block_key_tile(pages_u8, s8_b, pages_u16, s16_b, pages_f32, s32_b, block_table_ptr, stride_bt, req, tile,
                        s, s_ok, num_blocks, max_blocks, FMT: tl.constexpr, DOT: tl.constexpr,
                        TOKEN_BYTES: tl.constexpr):
    """:func:`_key_tile` when the tile is exactly one cache block (``BLOCK_N == block_tokens``, packed and
    aligned records): one block-table entry and one base pointer per tile, and record offsets that are
    the same for every tile (the compiler hoists them out of the tile loop). The integer ALU was the
    indexer's busiest pipe (62%: ncu on the H200, 2026-11-29), and per-key block lookups, a division by
    the run-time block size and 64-bit pointers per element are ALU work this removes. Measured: bf16
    queries -15% at 128K; the pipelined FP8-query loop +4% (it keeps per-key addressing)."""
    dims = tl.arange(0, 128)
    keys_in_block = tl.arange(0, s.shape[0])
    in_table = tile < max_blocks
    block = tl.load(block_table_ptr + req * stride_bt + tile, mask=in_table, other=-1)
    block_ok = in_table & (block >= 0) & (block < num_blocks)
    # block_ok as a lane vector: the interpreter mishandles masks that mix tensors and scalars
    mapped = s_ok & ((keys_in_block * 0 + block_ok.to(tl.int32)) != 0)
    block = tl.where(block_ok, block, 0).to(tl.int64)
    if FMT == 0:
        offsets = keys_in_block[:, None] * (TOKEN_BYTES // 2) + dims[None, :]
        keys = _bf16_keys_for_dot(tl.load(pages_u16 + block * s16_b + offsets, mask=mapped[:, None], other=0), DOT)
        scale = tl.full(s.shape, 1.0, tl.float32)
    else:
        offsets = keys_in_block[:, None] * TOKEN_BYTES + dims[None, :]
        keys = _fp8_keys_for_dot(tl.load(pages_u8 + block * s8_b + offsets, mask=mapped[:, None], other=0.0), DOT)
        scale = tl.load(pages_f32 + block * s32_b + keys_in_block * (TOKEN_BYTES // 4) + 32, mask=mapped, other=0.0)
    return keys, scale, mapped


@triton.jit
def _mxfp4_key_tile(pages_u8, s8_b, s8_t, block_table_ptr, stride_bt, req, tile, s, s_ok, num_blocks, max_blocks,
                    block_tokens, TOKEN_BYTES: tl.constexpr, ONE_BLOCK: tl.constexpr):
    """MXFP4 keys at positions ``s`` [BLOCK_N] of request ``req`` -> (packed [BLOCK_N, 64] uint8 e2m1 pairs,
    scales [BLOCK_N, 4] uint8 UE8M0, mapped [BLOCK_N]).

    Records are bytes only, so any record address works through the uint8 view (no aligned variant).
    ``ONE_BLOCK`` (``BLOCK_N == block_tokens``, packed records): one table lookup per tile and record
    offsets that do not depend on the tile, as :func:`_one_block_key_tile`; else per-key addressing.
    """
    pairs = tl.arange(0, 64)
    blocks = tl.arange(0, 4)
    if ONE_BLOCK:
        keys_in_block = tl.arange(0, s.shape[0])
        in_table = tile < max_blocks
        block = tl.load(block_table_ptr + req * stride_bt + tile, mask=in_table, other=-1)
        block_ok = in_table & (block >= 0) & (block < num_blocks)
        # block_ok as a lane vector: the interpreter mishandles masks that mix tensors and scalars
        mapped = s_ok & ((keys_in_block * 0 + block_ok.to(tl.int32)) != 0)
        base = pages_u8 + tl.where(block_ok, block, 0).to(tl.int64) * s8_b
        row = keys_in_block * TOKEN_BYTES
    else:
        logical = s // block_tokens
        block = tl.load(block_table_ptr + req * stride_bt + logical, mask=s_ok & (logical < max_blocks), other=-1)
        mapped = s_ok & (block >= 0) & (block < num_blocks)
        block = tl.where(mapped, block, 0).to(tl.int64)
        base = pages_u8
        if TOKEN_BYTES > 0:
            row = block * s8_b + (s % block_tokens) * TOKEN_BYTES
        else:
            row = block * s8_b + (s % block_tokens) * s8_t
    packed = tl.load(base + row[:, None] + pairs[None, :], mask=mapped[:, None], other=0)
    scales = tl.load(base + row[:, None] + 64 + blocks[None, :], mask=mapped[:, None], other=0)
    return packed, scales, mapped


@triton.jit
def _mxfp4_keys_for_dot(packed, scales, DOT: tl.constexpr):
    """Packed MXFP4 keys [BLOCK_N, 64] and their scales [BLOCK_N, 4] -> (even dims, odd dims), each
    [BLOCK_N, 64] in the MMA operand type (bf16 or fp32; exact in both). Pair ``i`` of a key is in
    scale block ``i // 16``."""
    rows: tl.constexpr = packed.shape[0]
    per_pair = tl.reshape(tl.broadcast_to(scales[:, :, None], [rows, 4, 16]), [rows, 64])
    even = e2m1_ue8m0_value(packed & 0xF, per_pair)
    odd = e2m1_ue8m0_value(packed >> 4, per_pair)
    if DOT == 0:
        even = even.to(tl.bfloat16)
        odd = odd.to(tl.bfloat16)
    return even, odd


@triton.jit
def _mxfp4_logits(packed, scales, q, DOT: tl.constexpr, SCALED_DOT: tl.constexpr, KEYS_AS_B: tl.constexpr):
    """Dot products of MXFP4 keys with the segment's queries: ``[BLOCK_N, rows]`` (``[rows, BLOCK_N]``
    with ``KEYS_AS_B``). ``q`` is the bf16 ``[rows, 128]`` operand for ``tl.dot_scaled`` (``SCALED_DOT`` 1, or
    2 for ``fast_math``: no NaN for scale byte 255, which no encoder writes), else its (even dims, odd dims)
    halves ``[rows, 64]``."""
    if SCALED_DOT > 0:
        if KEYS_AS_B:
            logits = tl.dot_scaled(q, None, "bf16", tl.trans(packed), scales, "e2m1", fast_math=SCALED_DOT == 2)
        else:
            logits = tl.dot_scaled(packed, scales, "e2m1", tl.trans(q), None, "bf16", fast_math=SCALED_DOT == 2)
    else:
        even, odd = _mxfp4_keys_for_dot(packed, scales, DOT)
        q_even, q_odd = q
        if KEYS_AS_B:
            if DOT == 2:
                logits = tl.dot(q_odd, tl.trans(odd), tl.dot(q_even, tl.trans(even), input_precision="ieee"),
                                input_precision="ieee")
            else:
                logits = tl.dot(q_odd, tl.trans(odd), tl.dot(q_even, tl.trans(even)))
        else:
            if DOT == 2:
                logits = tl.dot(odd, tl.trans(q_odd), tl.dot(even, tl.trans(q_even), input_precision="ieee"),
                                input_precision="ieee")
            else:
                logits = tl.dot(odd, tl.trans(q_odd), tl.dot(even, tl.trans(q_even)))
    return logits


# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("T", "H", "max_context", "num_blocks", "max_blocks", "block_tokens")
# the arguments that describe the index cache, the same whichever rows a batch holds (compile_budget: batch-invariant
# mode keeps their alignment facts)
CACHE_ARGS = {"indexer_score_kernel": ("pages_u8", "s8_b", "s8_t", "pages_u16", "s16_b", "s16_t", "pages_f32",
                                       "s32_b", "s32_t")}
# the queries and weights, which :func:`indexer_score` makes aligned on every call (.alignment.aligned_rows): batch-
# invariant mode keeps their facts too
LAUNCHER_ALIGNED_ARGS = {"indexer_score_kernel": ("q_ptr", "stride_qt", "stride_qh", "w_ptr", "stride_wt")}


@triton.jit(do_not_specialize=SIZE_ARGS)
def indexer_score_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 128]
    w_ptr, stride_wt,  # weights [T, H] fp32 (unit stride in H)
    pages_u8, s8_b, s8_t, pages_u16, s16_b, s16_t, pages_f32, s32_b, s32_t,  # typed views of the index pages,
    # each with its (block, token) strides in elements
    block_table_ptr, stride_bt,  # [B, max_blocks]
    req_ptr, pos_ptr, run_offset_ptr,  # [T]: request, position, index of the token within its request's run
    out_ptr, stride_ot,  # scores [T, max_context] fp32
    T, H, max_context, num_blocks, max_blocks, block_tokens,
    FMT: tl.constexpr, DOT: tl.constexpr, TOKEN_BYTES: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, GROUP: tl.constexpr, TILES: tl.constexpr, ALIGNED: tl.constexpr,
    PIPELINE: tl.constexpr,  # key tiles in a pipelined loop (else unrolled)
    KEYS_AS_B: tl.constexpr,  # q @ keysᵀ (keys in shared memory, prefetchable) instead of keys @ qᵀ
    ONE_BLOCK: tl.constexpr,  # BLOCK_N == block_tokens on packed, aligned pages: a tile is one cache block
    SCALED_DOT: tl.constexpr = 0,  # MXFP4 keys, bf16 MMA: 0 explicit decode, 1 tl.dot_scaled, 2 the same with fast_math
):
    t0 = tl.program_id(1)
    is_start = tl.load(run_offset_ptr + t0) % GROUP == 0  # only a segment's first token works
    views = (pages_u8, s8_b, s8_t, pages_u16, s16_b, s16_t, pages_f32, s32_b, s32_t)
    sizes = (max_context, num_blocks, max_blocks, block_tokens)
    if PIPELINE:
        # A loop at the top level (not under a branch), which the software pipeliner may stage
        # num_stages deep; other tokens' programs mask their loads and run it zero times.
        q, w, segment = _load_segment(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, req_ptr, pos_ptr, t0, T, H,
                                      is_start, FMT, DOT, BLOCK_H, GROUP, SCALED_DOT)
        for tile in range(tl.where(is_start, TILES, 0)):
            _score_tile(tl.program_id(0) * TILES + tile, q, w, views, block_table_ptr, stride_bt, segment, sizes,
                        out_ptr, stride_ot, FMT, DOT, TOKEN_BYTES, GROUP, BLOCK_H, BLOCK_N, ALIGNED, KEYS_AS_B,
                        ONE_BLOCK, SCALED_DOT)
    elif is_start:  # unrolled; other tokens' programs exit at once
        q, w, segment = _load_segment(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, req_ptr, pos_ptr, t0, T, H,
                                      is_start, FMT, DOT, BLOCK_H, GROUP, SCALED_DOT)
        for tile in tl.static_range(TILES):
            _score_tile(tl.program_id(0) * TILES + tile, q, w, views, block_table_ptr, stride_bt, segment, sizes,
                        out_ptr, stride_ot, FMT, DOT, TOKEN_BYTES, GROUP, BLOCK_H, BLOCK_N, ALIGNED, KEYS_AS_B,
                        ONE_BLOCK, SCALED_DOT)


@triton.jit
def _q_for_dot(q, DOT: tl.constexpr):
    if DOT == 0:
        q = q.to(tl.bfloat16)
    elif DOT == 2:
        q = q.to(tl.float32)
    return q


@triton.jit
def _load_segment(q_ptr, stride_qt, stride_qh, w_ptr, stride_wt, req_ptr, pos_ptr, t0, T, H, is_start,
                  FMT: tl.constexpr, DOT: tl.constexpr, BLOCK_H: tl.constexpr, GROUP: tl.constexpr,
                  SCALED_DOT: tl.constexpr):
    """The segment of token ``t0`` (it and up to ``GROUP - 1`` following tokens of the same request):
    its queries as one ``[GROUP * BLOCK_H, 128]`` operand (for MXFP4 keys decoded explicitly: its
    even-dim and odd-dim halves, ``[GROUP * BLOCK_H, 64]`` each), their head weights, and
    ``(request, member mask, member positions, member token ids, furthest position)``."""
    req = tl.load(req_ptr + t0).to(tl.int64)
    members = t0 + tl.arange(0, GROUP)
    # is_start as lane vectors: the interpreter mishandles masks that mix tensors and scalars
    member_ok = (members < T) & (tl.load(req_ptr + members, mask=members < T, other=-1) == req) \
        & ((members * 0 + is_start.to(tl.int32)) != 0)
    member_pos = tl.load(pos_ptr + members, mask=member_ok, other=-1).to(tl.int64)
    reach = tl.max(member_pos, axis=0)
    rows = tl.arange(0, GROUP * BLOCK_H)
    row_tok = t0 + rows // BLOCK_H
    row_head = rows % BLOCK_H
    row_ok = (row_tok < T) & (row_head < H) & ((rows * 0 + is_start.to(tl.int32)) != 0)
    row_ok = row_ok & (tl.load(req_ptr + row_tok, mask=row_ok, other=-1) == req)
    q_rows = q_ptr + row_tok.to(tl.int64)[:, None] * stride_qt + row_head[:, None] * stride_qh
    if FMT == 2:
        if SCALED_DOT > 0:
            q = _q_for_dot(tl.load(q_rows + tl.arange(0, 128)[None, :], mask=row_ok[:, None], other=0.0), DOT)
        else:  # MXFP4 keys decoded explicitly: the even and odd dims multiply separately
            half = tl.arange(0, 64)
            q_even = _q_for_dot(tl.load(q_rows + 2 * half[None, :], mask=row_ok[:, None], other=0.0), DOT)
            q_odd = _q_for_dot(tl.load(q_rows + 2 * half[None, :] + 1, mask=row_ok[:, None], other=0.0), DOT)
            q = (q_even, q_odd)
    else:
        q = _q_for_dot(tl.load(q_rows + tl.arange(0, 128)[None, :], mask=row_ok[:, None], other=0.0), DOT)
    w = tl.load(w_ptr + row_tok.to(tl.int64) * stride_wt + row_head, mask=row_ok, other=0.0)
    return q, w, (req, member_ok, member_pos, members, reach)

@triton.jit
def _score_tile(tile, q, w, views, block_table_ptr, stride_bt, segment, sizes, out_ptr, stride_ot,
                FMT: tl.constexpr, DOT: tl.constexpr, TOKEN_BYTES: tl.constexpr, GROUP: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr, KEYS_AS_B: tl.constexpr,
                ONE_BLOCK: tl.constexpr, SCALED_DOT: tl.constexpr):
    """Scores of key tile ``tile`` (``BLOCK_N`` positions) for every token of the segment: one MMA
    (two for MXFP4 keys decoded explicitly)."""
    pages_u8, s8_b, s8_t, pages_u16, s16_b, s16_t, pages_f32, s32_b, s32_t = views
    req, member_ok, member_pos, members, reach = segment
    max_context, num_blocks, max_blocks, block_tokens = sizes
    s = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    s_ok = (s <= reach) & (s < max_context)
    if FMT == 2:  # MXFP4: the scales are inside the dot; no per-key scale after it
        packed, block_scales, mapped = _mxfp4_key_tile(pages_u8, s8_b, s8_t, block_table_ptr, stride_bt, req, tile,
                                                       s, s_ok, num_blocks, max_blocks, block_tokens, TOKEN_BYTES,
                                                       ONE_BLOCK)
        logits = _mxfp4_logits(packed, block_scales, q, DOT, SCALED_DOT, KEYS_AS_B)
    else:
        keys, scale, mapped = _key_tile(pages_u8, s8_b, s8_t, pages_u16, s16_b, s16_t, pages_f32, s32_b, s32_t,
                                        block_table_ptr, stride_bt, req, tile, s, s_ok, num_blocks, max_blocks,
                                        block_tokens, FMT, DOT, TOKEN_BYTES, ALIGNED, ONE_BLOCK)
        if KEYS_AS_B:
            # q @ keysᵀ: the keys are the MMA's B operand, which lives in shared memory, so the software
            # pipeliner can prefetch them with async copies; the head sum then runs across warps.
            if DOT == 2:
                logits = tl.dot(q, tl.trans(keys), input_precision="ieee")  # [GROUP * BLOCK_H, BLOCK_N]
            else:
                logits = tl.dot(q, tl.trans(keys))
        else:
            if DOT == 2:
                logits = tl.dot(keys, tl.trans(q), input_precision="ieee")  # [BLOCK_N, GROUP * BLOCK_H]
            else:
                logits = tl.dot(keys, tl.trans(q))
    if KEYS_AS_B:
        weighted = tl.maximum(logits, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[:, None]
        score = tl.sum(tl.reshape(weighted, [GROUP, BLOCK_H, BLOCK_N]), axis=1)  # [GROUP, BLOCK_N]
        if FMT != 2:
            score = score * scale[None, :]
        visible = (s[None, :] <= member_pos[:, None]) & mapped[None, :]
        score = tl.where(visible, score, float("-inf"))
        out = out_ptr + members.to(tl.int64)[:, None] * stride_ot + s[None, :]
        tl.store(out, score, mask=member_ok[:, None] & (s < max_context)[None, :])
    else:
        weighted = tl.maximum(logits, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[None, :]
        score = tl.sum(tl.reshape(weighted, [BLOCK_N, GROUP, BLOCK_H]), axis=2)  # [BLOCK_N, GROUP]
        if FMT != 2:
            score = score * scale[:, None]
        visible = (s[:, None] <= member_pos[None, :]) & mapped[:, None]
        score = tl.where(visible, score, float("-inf"))
        out = out_ptr + members.to(tl.int64)[None, :] * stride_ot + s[:, None]
        tl.store(out, score, mask=member_ok[None, :] & (s < max_context)[:, None])

def pick_dot(q_dtype, index_fmt):
    """FP8 q on FP8 keys: FP8 MMA. bf16 q, or FP8 q on bf16 / MXFP4 keys: bf16 MMA (exact widening).
    Else (fp32, fp16 queries) exact fp32 dots."""
    if q_dtype == torch.float8_e4m3fn:
        return DOT_FP8 if index_fmt == "fp8" else DOT_BF16
    if q_dtype == torch.bfloat16:
        return DOT_BF16
    return DOT_FP32


def tile_shape(heads, dot, block_n, group, tiles):
    """``(block_h, block_n, group, tiles)`` the kernel is launched with for ``heads`` query heads.

    Exact fp32 dots are lowered to FMA loops unrolled over the whole tile: the tensor-core tile
    (8 tokens x 32 heads x 64 keys, 4 tiles) made ptxas run for minutes on the H200 (conformance,
    2026-11-29). That path is for exactness, not speed: one token, one tile of <= 32 keys.

    The segment operand (``group x block_h`` rows) is capped at 256 rows, the widest Hopper MMA: at
    64 heads x 8 tokens (512) the H200 returned wrong scores (conformance, 2026-11-29; 32 heads, the
    benchmarked shape, was right), and the [64, 512] fp32 accumulator alone would fill every register.
    """
    if dot == DOT_FP32:
        block_n, group, tiles = min(block_n, 32), 1, 1
    block_h = triton.next_power_of_2(heads)
    group = max(1, min(group, MAX_SEGMENT_ROWS // block_h))
    block_h = max(block_h, triton.cdiv(16, group))  # the MMA needs N >= 16
    return block_h, block_n, group, tiles


def _tokens_per_request(tokens: int, rows: int) -> int:
    """A call's query tokens per request, ``ceil(tokens / rows)`` for ``rows`` block-table rows (a decode step's 1, 2
    or 5; more rows than requests only shortens it): what the block tiles' per-call choices go by."""
    return -(-tokens // max(1, rows))


def _request_group(group: int, tokens: int, rows: int, per_request) -> int:
    """Tokens per block-tile segment: ``group``, or with ``per_request`` (True, or the fewest tokens per request
    it applies from) no more than the call's tokens per request ``ceil(tokens / rows)`` (a decode step's 1, 2 or 5;
    more block-table rows than requests only shortens them), so a compile for that length serves the call and the
    absent members' registers go to more programs per SM. A segment's length changes no score's arithmetic (one MMA
    per token), only which tokens share a key tile's loads."""
    if per_request is False or per_request is None:
        return group
    per_call = _tokens_per_request(tokens, rows)
    if per_call < int(per_request):
        return group
    return max(1, min(group, per_call))


def _l2_ahead(l2_ahead: int, tokens: int, rows: int, up_to_tokens) -> int:
    """The block tiles' L2 hint distance for a call: ``l2_ahead``, or 0 (no hint) when ``up_to_tokens`` is an int
    and the call has more query tokens per request (:func:`_tokens_per_request`). The hint's prefetches are L2 requests beside the loads' own: they paid at 1-2 tokens a request and cost
    at 5 and at prefill, where a tile's MMAs give the rolled loop's register prefetch time enough (H200, eighteenth
    session: BENCHMARKS.md). A hint changes no score."""
    if up_to_tokens is None or _tokens_per_request(tokens, rows) <= int(up_to_tokens):
        return l2_ahead
    return 0


def gluon_options(tile: dict, per_request: int) -> dict:
    """The Gluon kernel's launch options that ``tile`` names for calls of ``per_request`` tokens a request (``{}``:
    none). ``gluon_stages`` maps tokens per request to stages (with ``gluon_depth`` token MMAs in flight, default 2,
    and ``gluon_head_sum``: the head sums as MMAs); ``gluon_more``, the options (``stages``, ``depth``, ``maxnreg``,
    ``head_sum_mma``, ``group``: tokens a segment) for calls of more tokens a request than ``gluon_stages`` names
    (speculative decode, prefill). The one reading of the configuration: the backend's calls and the AOT build's
    launches (``backends/nvidia/aot.py``)."""
    by_tokens = tile.get("gluon_stages") or {}
    if per_request in by_tokens:
        plan = dict(stages=by_tokens[per_request], depth=tile.get("gluon_depth", 2))
        if tile.get("gluon_head_sum"):
            plan["head_sum_mma"] = True
        return plan
    if by_tokens and per_request > max(by_tokens) and tile.get("gluon_more"):
        return dict(tile["gluon_more"])
    return {}


def _gluon_plan(tile: dict, q, index_pages, index_fmt, tokens: int, rows: int) -> dict:
    """The Gluon kernel's launch options for a call (``{}``: the call takes the ``tl`` block tiles):
    :func:`gluon_options` for its tokens a request (:func:`_tokens_per_request`). A call the configuration names no
    launch for, or one the kernel refuses (:func:`.indexer_gluon.refusal`: bf16 keys, not an sm_90 GPU, ...), or a
    Triton that does not compile it, gets ``{}``. The scores are the same contract either way."""
    plan = gluon_options(tile, _tokens_per_request(tokens, rows))
    if not plan.get("stages") or not indexer_decode.runs_ptx(q.device):  # (Gluon is not imported for CPU or ROCm)
        return {}
    from . import indexer_gluon  # (imports Gluon)

    # (the group a call's launch gets is 1..MAX_GROUP like any plan's, so this refusal is the launch's: it is
    # told so and does not run it again)
    if indexer_gluon.refusal(q, index_pages, index_fmt, plan.get("group", 1)):
        return {}
    if indexer_gluon.compile_failure(q.dtype == torch.bfloat16, index_fmt == "mxfp4",
                                     plan.get("head_sum_mma", False), tile.get("gluon_mx_fold", False)):
        return {}
    return dict(plan, stacked=tile.get("gluon_stacked", False), mx_registers=tile.get("gluon_mx_registers", False),
                mx_fold=tile.get("gluon_mx_fold", False), refusal_checked=True)


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context, *,
                  block_n=64, group=8, tiles=4, num_warps=4, num_stages=1, pipeline=False, typed_keys=False,
                  keys_as_b=False, one_block_tiles=True, mxfp4_dot_scaled=True, mxfp4_fast_math=False, dot=None,
                  block_tiles: bool | dict = False, tile_group=None, tile_loop=None, out=None, requests=None,
                  group_maxima=None, maxima_group=16):
    """Launch :func:`indexer_score_kernel`.

    Args:
        q: ``[T, H, 128]`` bf16/fp16/fp32/float8_e4m3fn (unit stride in the last dim).
        weights: ``[T, H]`` fp32.
        index_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 (256 B bf16, 132 B fp8, 68 B mxfp4),
            tokens of a block contiguous (``stride(1) == token_bytes``).
        block_table: ``[B, max_blocks]`` int32, -1 unmapped. req_ids, positions: ``[T]`` int32.
        index_fmt: ``"bf16"``, ``"fp8"`` or ``"mxfp4"``. max_context: output width.
        block_n: key positions per MMA; group: query tokens per segment; tiles: key tiles per program
            (fp32/fp16 queries, whose dots run exactly in fp32, use one token and one tile of <= 32 keys).
        pipeline: run the key tiles in a loop the software pipeliner stages ``num_stages`` deep
            (else unrolled). typed_keys: read aligned keys through an fp8 (FP8 MMA) or bf16 (bf16 MMA)
            view of the pages, so the load feeds the MMA with no conversion between them.
        keys_as_b: compute ``q @ keysᵀ`` (keys as the MMA's shared-memory operand: what the pipeliner
            can prefetch) rather than ``keys @ qᵀ`` (keys in registers, heads summed within a warp).
        one_block_tiles: when a key tile is exactly one cache block (``block_n == block_tokens``, packed
            aligned records), address it with one table lookup and tile-invariant offsets.
        mxfp4_dot_scaled: MXFP4 keys with bf16/FP8 queries: ``tl.dot_scaled`` on the packed keys (True),
            or an explicit decode into two bf16 halves (False). fp32/fp16 queries always decode explicitly.
        mxfp4_fast_math: ``tl.dot_scaled``'s fast_math (scale byte 255 is not turned into NaN; no encoder
            writes it, the reference reads it as 2^128 = Inf).
        block_tiles: send FP8 / MXFP4 keys in packed, 4-byte aligned pages with tensor-core dots (bf16 or
            FP8 queries) and key tiles inside one cache block to :mod:`.indexer_decode` (one MMA per query
            token, no load masks, tiles past the segment's reach skipped); other calls, and False (the
            default until the H200 sweep ``scripts/h200/indexer_sweep.py`` has timed it), take the general
            kernel.
            ``block_tiles`` may be a dict of the block-tile path's own parameters (``block_n``, ``group``,
            ``tile_group``, ``tiles``, ``tile_loop``, ``pipeline``, ``num_warps``, ``num_stages``, ``typed_keys``,
            ``mxfp4_mode``, ``alu``: :data:`.indexer_decode.ALU_FLAGS`, each call taking the flags that fit it
            (:func:`.indexer_decode.fitting_alu`); ``group_per_request``: segments of at most ceil(T / B)
            tokens, B the block table's rows (True), or only when ceil(T / B) is at least that int
            (:func:`_request_group`); ``wide_tiles``: longer key chunks when the launch has programs
            to spare, :func:`.indexer_decode.tiles_per_program`; ``l2_ahead``: the L2 hint of
            :func:`.indexer_decode.launch`; ``l2_ahead_tokens``: the hint only for calls of at most that many tokens
            per request, :func:`_l2_ahead`; ``gluon_stages``: ``{tokens per request: stages}``, the calls of those
            lengths that :mod:`.indexer_gluon` takes go to it, with that many tiles in flight, :func:`_gluon_plan`;
            ``gluon_depth``: its token MMAs in flight, default 2; ``gluon_more``: its launch options for calls of more
            tokens a request than ``gluon_stages`` names; ``gluon_stacked``: bf16 queries' hi and lo parts as
            one MMA a token there, default False; ``gluon_mx_registers``: MXFP4 keys decoded into the MMAs' register
            operands there, default False; ``gluon_mx_fold``: MXFP4 keys' block scales folded into their decoded
            codes there, :func:`.indexer_gluon.launch`'s ``mx_fold``, default False),
            the other arguments then being the general kernel's, for the calls that fall back to it.
            There ``group`` (or ``tile_group``, <= 8) is the tokens per segment, ``tiles``, ``num_warps``,
            ``num_stages``, ``typed_keys``, ``mxfp4_dot_scaled`` / ``mxfp4_fast_math`` mean the same;
            ``tile_loop``: 0 unrolled tiles, 1 a rolled loop prefetching the next tile into registers, 2 a
            rolled loop for the software pipeliner (default: 2 with ``pipeline``, else 0).
        out: optional ``[T, max_context]`` fp32 buffer (unit stride in the last dim).
        requests: how many requests the call's tokens come from, where the caller knows it better than the block
            table's rows (default): a DSA layer scoring a token range of a larger batch passes the range's share of
            the batch's requests, so the range gets the whole batch's launch plan (tokens a segment, the Gluon
            kernel's options: :func:`_tokens_per_request`). It plans the launch only; every row's scores are
            computed the same either way, up to the plan's last bits.
        group_maxima: the fused indexer -> top-k: an int32 ``[T, >= cdiv(max_context, maxima_group)]`` tensor (unit
            last stride) that the call fills with the maxima of each token's groups of ``maxima_group`` consecutive
            scores, as the top-k's groups method would make them (:func:`.indexer_gluon.launch`'s ``maxima``), where
            the Gluon kernel takes the call; no other kernel makes them.

    Returns:
        ``[T, max_context]`` fp32 scores, -inf where not visible; with ``group_maxima``, ``(scores, filled)``:
        whether the call filled them.
    """
    tokens, heads, _ = q.shape
    if requests is not None and not (isinstance(requests, int) and not isinstance(requests, bool) and requests >= 1):
        raise ValueError(f"triton indexer_score: requests expected an int >= 1, got {requests!r}")
    rows = block_table.shape[0] if requests is None else requests
    q, weights = aligned_rows(q), aligned_rows(weights)  # (LAUNCHER_ALIGNED_ARGS)
    if out is None:
        out = torch.empty((tokens, max_context), dtype=torch.float32, device=q.device)
    if group_maxima is not None:  # (checked whichever kernel takes the call)
        from .topk_groups import check_producer_maxima

        check_producer_maxima("triton indexer_score", "group_maxima", group_maxima, maxima_group, tokens, max_context,
                              q.device)
    scores, filled = _scores(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context, out,
                             rows, (group_maxima, maxima_group) if group_maxima is not None else None,
                             block_n=block_n, group=group, tiles=tiles, num_warps=num_warps, num_stages=num_stages,
                             pipeline=pipeline, typed_keys=typed_keys, keys_as_b=keys_as_b,
                             one_block_tiles=one_block_tiles, mxfp4_dot_scaled=mxfp4_dot_scaled,
                             mxfp4_fast_math=mxfp4_fast_math, dot=dot, block_tiles=block_tiles, tile_group=tile_group,
                             tile_loop=tile_loop)
    return scores if group_maxima is None else (scores, filled)


def _scores(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context, out, rows, maxima, *,
            block_n, group, tiles, num_warps, num_stages, pipeline, typed_keys, keys_as_b, one_block_tiles,
            mxfp4_dot_scaled, mxfp4_fast_math, dot, block_tiles, tile_group, tile_loop):
    """:func:`indexer_score`'s launches into ``out`` for ``rows`` requests; ``maxima``: ``(tensor, group size)`` for
    the Gluon kernel to fill, or None. Returns ``(out, whether the maxima were filled)``."""
    tokens = q.shape[0]
    heads = q.shape[1]
    if tokens == 0:
        return out, False
    aligned = views_usable(index_pages)
    packed_bytes = index_pages.shape[-1] if index_pages.stride(1) == index_pages.shape[-1] else 0
    if index_fmt not in INDEX_CODES:
        raise ValueError(f"triton indexer_score: index_fmt must be one of {sorted(INDEX_CODES)}, got {index_fmt!r}")
    dot = pick_dot(q.dtype, index_fmt) if dot is None else dot
    mxfp4 = INDEX_CODES[index_fmt] == INDEX_MXFP4
    if mxfp4 and dot == DOT_FP8:
        raise ValueError("triton indexer_score: mxfp4 keys are multiplied in bf16 or fp32 (dot=DOT_BF16 or "
                         "DOT_FP32), got dot=DOT_FP8")
    if block_tiles and indexer_decode.serves(q, index_pages, index_fmt, dot, block_n):
        tile = dict(block_n=block_n, group=group, tiles=tiles, pipeline=pipeline, num_warps=num_warps,
                    num_stages=num_stages, typed_keys=typed_keys, tile_group=tile_group, tile_loop=tile_loop)
        if isinstance(block_tiles, dict):  # the block-tile path's own parameters; the rest are the fallback's
            tile.update(block_tiles)
        # MXFP4 keys: one of indexer_decode.MXFP4_MODES (0: tl.dot_scaled or the per-element decode, as
        # mxfp4_dot_scaled says); a block-tile parameter only
        mxfp4_mode = tile.get("mxfp4_mode", 0) if mxfp4 else 0
        alu = indexer_decode.fitting_alu(tile.get("alu", 0), index_fmt, tile["block_n"], index_pages.shape[1],
                                         mxfp4_mode, dot=dot, q_dtype=q.dtype)
        group = min(tile["tile_group"] or tile["group"], indexer_decode.MAX_GROUP)
        group = _request_group(group, tokens, rows, tile.get("group_per_request", False))
        plan = _gluon_plan(tile, q, index_pages, index_fmt, tokens, rows)
        if plan:
            from . import indexer_gluon  # (imports Gluon)

            # segments of the call's tokens a request, at most the plan's group (the kernel runs every member's MMA,
            # present or not)
            group = _request_group(plan.pop("group", group), tokens, rows, True)
            offsets, starts = segment_plan(req_ids, group)
            if maxima is not None:
                plan.update(maxima=maxima[0], maxima_group=maxima[1])
            return indexer_gluon.launch(q, weights, index_pages, block_table, req_ids, positions, offsets, max_context,
                                        out, starts=starts, group=group, index_fmt=index_fmt, requests=rows,
                                        **plan), maxima is not None
        offsets, starts = segment_plan(req_ids, group)  # one launch
        return indexer_decode.launch(
            q, weights, index_pages, block_table, req_ids, positions, offsets, index_fmt, max_context,
            out, starts=starts, dot=dot, block_n=tile["block_n"],
            group=group, tiles=tile["tiles"],
            loop=(2 if tile["pipeline"] else 0) if tile["tile_loop"] is None else tile["tile_loop"],
            num_warps=tile["num_warps"], num_stages=tile["num_stages"], typed_keys=tile["typed_keys"],
            scaled_dot=((2 if mxfp4_fast_math else 1) if mxfp4 and mxfp4_dot_scaled and not mxfp4_mode else 0),
            mxfp4_mode=mxfp4_mode, alu=alu, wide_tiles=tile.get("wide_tiles"), requests=rows,
            l2_ahead=_l2_ahead(tile.get("l2_ahead", 0), tokens, rows, tile.get("l2_ahead_tokens"))), False
    block_h, block_n, group, tiles = tile_shape(heads, dot, block_n, group, tiles)
    views = typed_views(index_pages)
    if typed_keys and aligned:
        if index_fmt == "fp8" and dot == DOT_FP8:  # the kernel's bitcast to e4m3 is then a no-op
            views[0] = (index_pages.view(torch.float8_e4m3fn), views[0][1], views[0][2])
        elif index_fmt == "bf16" and dot == DOT_BF16 and views[1][0].dtype == torch.uint16:  # same for bf16
            views[1] = (views[1][0].view(torch.bfloat16), views[1][1], views[1][2])
    one_block = one_block_tiles and aligned and packed_bytes > 0 and index_pages.shape[1] == block_n
    scaled_dot = (2 if mxfp4_fast_math else 1) if mxfp4 and dot == DOT_BF16 and mxfp4_dot_scaled else 0
    chunks = triton.cdiv(max_context, block_n * tiles)
    offsets = run_offsets(req_ids)
    sizes = (heads, max_context, index_pages.shape[0], block_table.shape[1], index_pages.shape[1])
    meta = dict(FMT=INDEX_CODES[index_fmt], DOT=dot, TOKEN_BYTES=packed_bytes, BLOCK_H=block_h, BLOCK_N=block_n,
                GROUP=group, TILES=tiles, ALIGNED=aligned, PIPELINE=pipeline, KEYS_AS_B=keys_as_b,
                ONE_BLOCK=one_block, SCALED_DOT=scaled_dot, num_warps=num_warps, num_stages=num_stages)
    if tokens <= launch_grid.MAX_GRID_YZ:
        _launch(chunks, tokens, q, weights, views, block_table, req_ids, positions, offsets, out, sizes, meta)
    else:
        # Tokens on grid axis 1 (CUDA: <= 65535 programs): one launch per range of programs. A segment's
        # first token loads up to GROUP - 1 tokens after it, which may lie past its range: each launch gets
        # the per-token tensors from its range's start to the end of the call (its T = the tokens left),
        # with programs for its range only, so every segment is scored once, by its first token, as in one
        # launch (run_offsets stays the whole call's: a range's first token is not a segment start for it).
        for start, stop in launch_grid.ranges(tokens):
            _launch(chunks, stop - start, q[start:], weights[start:], views, block_table, req_ids[start:],
                    positions[start:], offsets[start:], out[start:], sizes, meta)
    return out, False


def _launch(chunks, programs, q, weights, views, block_table, req_ids, positions, offsets, out, sizes, meta):
    """One launch of ``programs`` token programs (grid axis 1) over the per-token tensors ``q [T', H, 128]``,
    ``weights [T', H]``, ``req_ids`` / ``positions`` / ``offsets [T']`` and ``out [T', max_context]``, all
    from the same first token (``T' >= programs``: segments may reach past the programs' tokens); the pages
    and the block table (indexed by request id) whole. ``sizes``: ``(H, max_context, num_blocks, max_blocks,
    block_tokens)``."""
    indexer_score_kernel[(chunks, programs)](
        q, q.stride(0), q.stride(1),
        weights, weights.stride(0),
        *(x for view in views for x in view),
        block_table, block_table.stride(0),
        req_ids, positions, offsets,
        out, out.stride(0),
        q.shape[0], *sizes,
        **meta,
    )


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
