"""Paged lightning-indexer score over bf16 (256 B) or FP8 (132 B) index keys.

``score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s]) · k_scale[s]`` for ``s <= positions[t]``,
-inf elsewhere (and on unmapped or out-of-range blocks).

One program scores one tile of ``BLOCK_N`` key positions for a group of ``GROUP`` consecutive
query tokens. Decode batches lay out a request's query tokens (1 + speculative drafts) next to
each other, so the key tile is loaded once per request in the group and reused by its tokens. The dot is arranged as
``keys [BLOCK_N, 128] @ q_tᵀ [128, BLOCK_H]`` so that the large dimension is the MMA's M.
FP8 queries against FP8 keys use the FP8 tensor cores; anything else is widened exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bytes import INDEX_CODES, typed_views, widen_bf16

# Dot modes.
DOT_BF16 = 0
DOT_FP8 = 1
DOT_FP32 = 2


@triton.jit
def _key_tile(pages_u16, pages_u32, s16_b, s16_t, s32_b, s32_t, block_table_ptr, stride_bt, req, s, s_ok, num_blocks,
              max_blocks, block_tokens, FMT: tl.constexpr, DOT: tl.constexpr):
    """Keys at positions ``s`` [BLOCK_N] of request ``req`` -> (keys, scale [BLOCK_N], mapped [BLOCK_N]).

    bf16 keys: ``[BLOCK_N, 128]``. FP8 keys: ``[BLOCK_N, 32]`` int32 words, four e4m3 per word
    (a 132-byte record is only 4-byte aligned, so words are the widest aligned load); the caller
    splits them into byte planes.
    """
    logical = s // block_tokens
    block = tl.load(block_table_ptr + req * stride_bt + logical, mask=s_ok & (logical < max_blocks), other=-1)
    mapped = s_ok & (block >= 0) & (block < num_blocks)
    block = tl.where(mapped, block, 0).to(tl.int64)
    offset = s % block_tokens
    if FMT == 0:
        dims = tl.arange(0, 128)
        row = block * s16_b + offset * s16_t
        keys = widen_bf16(tl.load(pages_u16 + row[:, None] + dims[None, :], mask=mapped[:, None], other=0), DOT == 0)
        if DOT == 2:
            keys = keys.to(tl.float32)
        scale = tl.full(s.shape, 1.0, tl.float32)
    else:
        words = tl.arange(0, 32)
        row = block * s32_b + offset * s32_t
        keys = tl.load(pages_u32 + row[:, None] + words[None, :], mask=mapped[:, None], other=0.0)
        keys = keys.to(tl.int32, bitcast=True)
        scale = tl.load(pages_u32 + row + 32, mask=mapped, other=0.0)
    return keys, scale, mapped


@triton.jit
def _plane(words, b: tl.constexpr, DOT: tl.constexpr):
    """Byte ``b`` of each int32 word as e4m3 (or widened for a bf16/fp32 dot): ``[BLOCK_N, 32]``."""
    plane = ((words >> (8 * b)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    if DOT == 0:
        plane = plane.to(tl.bfloat16)
    elif DOT == 2:
        plane = plane.to(tl.float32)
    return plane


@triton.jit
def _logits(keys, q_row, heads, head_ok, FMT: tl.constexpr, DOT: tl.constexpr):
    """``keys · q_tᵀ``: ``[BLOCK_N, BLOCK_H]`` fp32."""
    if FMT == 0:
        dims = tl.arange(0, 128)
        q = tl.load(q_row + heads[:, None] * 0 + dims[None, :], mask=head_ok[:, None], other=0.0)
        q = q.to(keys.dtype)
        if DOT == 2:
            logits = tl.dot(keys, tl.trans(q), input_precision="ieee")
        else:
            logits = tl.dot(keys, tl.trans(q))
    else:
        lanes = tl.arange(0, 32)
        logits = tl.zeros([keys.shape[0], heads.shape[0]], tl.float32)
        for b in tl.static_range(4):  # dim 4*i + b lives in byte b of word i
            q = tl.load(q_row + heads[:, None] * 0 + 4 * lanes[None, :] + b, mask=head_ok[:, None], other=0.0)
            k_b = _plane(keys, b, DOT)
            q = q.to(k_b.dtype)
            if DOT == 2:
                logits = tl.dot(k_b, tl.trans(q), logits, input_precision="ieee")
            else:
                logits = tl.dot(k_b, tl.trans(q), logits)
    return logits


@triton.jit
def indexer_score_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 128]
    w_ptr, stride_wt,  # weights [T, H] fp32
    pages_u16, pages_u32, s16_b, s16_t, s32_b, s32_t,  # index pages as uint16 / int32 views, element strides
    block_table_ptr, stride_bt,  # [B, max_blocks]
    req_ptr, pos_ptr,  # [T]
    out_ptr, stride_ot,  # scores [T, max_context] fp32
    T, H, max_context, num_blocks, max_blocks, block_tokens,
    FMT: tl.constexpr, DOT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
):
    tile = tl.program_id(0)
    t0 = tl.program_id(1) * GROUP
    s = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    heads = tl.arange(0, BLOCK_H)
    head_ok = heads < H
    dims = tl.arange(0, 128)

    # A group's tokens of one request share one key tile: it is (re)loaded only when the request
    # changes, bounded by the furthest position among that request's remaining tokens in the group.
    cur_req = tl.load(req_ptr + t0).to(tl.int64)
    reach = tl.load(pos_ptr + t0).to(tl.int64)
    for j in tl.static_range(1, GROUP):
        same = (t0 + j < T) & (tl.load(req_ptr + t0 + j, mask=t0 + j < T, other=-1) == cur_req)
        reach = tl.maximum(reach, tl.where(same, tl.load(pos_ptr + t0 + j, mask=t0 + j < T, other=0).to(tl.int64), 0))
    keys, scale, mapped = _key_tile(pages_u16, pages_u32, s16_b, s16_t, s32_b, s32_t, block_table_ptr, stride_bt,
                                    cur_req, s, (s <= reach) & (s < max_context), num_blocks, max_blocks,
                                    block_tokens, FMT, DOT)

    for j in tl.static_range(0, GROUP):
        t = t0 + j
        if t < T:
            t64 = t.to(tl.int64)
            req = tl.load(req_ptr + t).to(tl.int64)
            pos = tl.load(pos_ptr + t).to(tl.int64)
            if req != cur_req:
                reach = pos
                for j2 in tl.static_range(j + 1, GROUP):
                    same = (t0 + j2 < T) & (tl.load(req_ptr + t0 + j2, mask=t0 + j2 < T, other=-1) == req)
                    later = tl.load(pos_ptr + t0 + j2, mask=t0 + j2 < T, other=0).to(tl.int64)
                    reach = tl.maximum(reach, tl.where(same, later, 0))
                keys, scale, mapped = _key_tile(pages_u16, pages_u32, s16_b, s16_t, s32_b, s32_t, block_table_ptr,
                                                stride_bt, req, s, (s <= reach) & (s < max_context), num_blocks,
                                                max_blocks, block_tokens, FMT, DOT)
                cur_req = req
            w = tl.load(w_ptr + t64 * stride_wt + heads, mask=head_ok, other=0.0)
            logits = _logits(keys, q_ptr + t64 * stride_qt + heads[:, None] * stride_qh, heads, head_ok, FMT,
                             DOT)
            score = tl.sum(tl.maximum(logits, 0.0) * w[None, :], axis=1) * scale
            score = tl.where((s <= pos) & mapped, score, float("-inf"))
            tl.store(out_ptr + t64 * stride_ot + s, score, mask=s < max_context)


def pick_dot(q_dtype, index_fmt):
    """FP8 q on FP8 keys: FP8 MMA. bf16 q, or FP8 q on bf16 keys: bf16 MMA (exact widening). Else fp32."""
    if q_dtype == torch.float8_e4m3fn:
        return DOT_FP8 if index_fmt == "fp8" else DOT_BF16
    if q_dtype == torch.bfloat16:
        return DOT_BF16
    return DOT_FP32


def indexer_score(q, weights, index_pages, block_table, req_ids, positions, index_fmt, max_context, *,
                  block_n=128, group=8, num_warps=4, num_stages=1, dot=None, out=None):
    """Launch :func:`indexer_score_kernel`.

    Args:
        q: ``[T, H, 128]`` bf16/fp16/fp32/float8_e4m3fn (unit stride in the last dim).
        weights: ``[T, H]`` fp32.
        index_pages: ``[num_blocks, block_tokens, token_bytes]`` uint8 (256 B bf16, 132 B fp8).
        block_table: ``[B, max_blocks]`` int32, -1 unmapped. req_ids, positions: ``[T]`` int32.
        index_fmt: ``"bf16"`` or ``"fp8"``. max_context: output width.
        block_n: key positions per program; group: query tokens sharing one key tile.
        out: optional ``[T, max_context]`` fp32 buffer (unit stride in the last dim).

    Returns:
        ``[T, max_context]`` fp32 scores, -inf where not visible.
    """
    tokens, heads, _ = q.shape
    q = q if q.stride(-1) == 1 else q.contiguous()
    if out is None:
        out = torch.empty((tokens, max_context), dtype=torch.float32, device=q.device)
    if tokens == 0:
        return out
    dot = pick_dot(q.dtype, index_fmt) if dot is None else dot
    block_h = max(16, triton.next_power_of_2(heads))
    grid = (triton.cdiv(max_context, block_n), triton.cdiv(tokens, group))
    views = typed_views(index_pages)
    indexer_score_kernel[grid](
        q, q.stride(0), q.stride(1),
        weights, weights.stride(0),
        views[1][0], views[2][0], views[1][1], views[1][2], views[2][1], views[2][2],
        block_table, block_table.stride(0),
        req_ids, positions,
        out, out.stride(0),
        tokens, heads, max_context, index_pages.shape[0], block_table.shape[1], index_pages.shape[1],
        FMT=INDEX_CODES[index_fmt], DOT=dot, BLOCK_H=block_h, BLOCK_N=block_n, GROUP=group,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
