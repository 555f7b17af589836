"""Paged lightning-indexer score over bf16 (256 B) or FP8 (132 B) index keys.

``score[t, s] = Σ_h w[t, h] · relu(q[t, h] · k[s]) · k_scale[s]`` for ``s <= positions[t]``,
-inf elsewhere (and on unmapped or out-of-range blocks).

One program scores one tile of ``BLOCK_N`` key positions for a group of ``GROUP`` consecutive
query tokens. Decode batches lay out a request's query tokens (1 + speculative drafts) next to
each other, so the key tile is loaded once and reused for every token of the group that belongs
to the same request (a token of another request loads its own tile). The dot is arranged as
``keys [BLOCK_N, 128] @ q_tᵀ [128, BLOCK_H]`` so that the large dimension is the MMA's M.
FP8 queries against FP8 keys use the FP8 tensor cores; anything else is widened exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .bytes import INDEX_CODES, load_bf16, load_f32

# Dot modes.
DOT_BF16 = 0
DOT_FP8 = 1
DOT_FP32 = 2


@triton.jit
def _key_tile(pages_ptr, stride_pb, stride_pt, block_table_ptr, stride_bt, req, s, s_ok, num_blocks, max_blocks,
              block_tokens, FMT: tl.constexpr, DOT: tl.constexpr):
    """Keys at positions ``s`` [BLOCK_N] of request ``req`` -> (keys [BLOCK_N, 128], scale [BLOCK_N], mapped)."""
    dims = tl.arange(0, 128)
    logical = s // block_tokens
    block = tl.load(block_table_ptr + req * stride_bt + logical, mask=s_ok & (logical < max_blocks), other=-1)
    mapped = s_ok & (block >= 0) & (block < num_blocks)
    row = tl.where(mapped, block, 0).to(tl.int64) * stride_pb + (s % block_tokens) * stride_pt
    base = pages_ptr + row[:, None]
    if FMT == 0:
        keys = load_bf16(base + 2 * dims[None, :], mapped[:, None], DOT == 0)
        scale = tl.full(s.shape, 1.0, tl.float32)
    else:
        raw = tl.load(base + dims[None, :], mask=mapped[:, None], other=0).to(tl.float8e4nv, bitcast=True)
        if DOT == 1:
            keys = raw
        elif DOT == 0:
            keys = raw.to(tl.bfloat16)
        else:
            keys = raw.to(tl.float32)
        scale = load_f32(pages_ptr + row + 128, mapped)
    if DOT == 2:
        keys = keys.to(tl.float32)
    return keys, scale, mapped


@triton.jit
def indexer_score_kernel(
    q_ptr, stride_qt, stride_qh,  # q [T, H, 128]
    w_ptr, stride_wt,  # weights [T, H] fp32
    pages_ptr, stride_pb, stride_pt,  # index pages [num_blocks, block_tokens, token_bytes] uint8
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

    req0 = tl.load(req_ptr + t0).to(tl.int64)
    # The group's furthest visible key bounds the shared tile's loads.
    reach = tl.load(pos_ptr + t0).to(tl.int64)
    for j in tl.static_range(1, GROUP):
        same = (t0 + j < T) & (tl.load(req_ptr + t0 + j, mask=t0 + j < T, other=-1) == req0)
        reach = tl.maximum(reach, tl.where(same, tl.load(pos_ptr + t0 + j, mask=t0 + j < T, other=0).to(tl.int64), 0))
    keys0, scale0, mapped0 = _key_tile(pages_ptr, stride_pb, stride_pt, block_table_ptr, stride_bt, req0, s,
                                       (s <= reach) & (s < max_context), num_blocks, max_blocks, block_tokens,
                                       FMT, DOT)

    for j in tl.static_range(0, GROUP):
        t = t0 + j
        if t < T:
            t64 = t.to(tl.int64)
            req = tl.load(req_ptr + t).to(tl.int64)
            pos = tl.load(pos_ptr + t).to(tl.int64)
            if req == req0:
                keys, scale, mapped = keys0, scale0, mapped0
            else:
                keys, scale, mapped = _key_tile(pages_ptr, stride_pb, stride_pt, block_table_ptr, stride_bt, req, s,
                                                (s <= pos) & (s < max_context), num_blocks, max_blocks,
                                                block_tokens, FMT, DOT)
            q = tl.load(q_ptr + t64 * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                        mask=head_ok[:, None], other=0.0)
            if DOT == 0:
                q = q.to(tl.bfloat16)
            elif DOT == 2:
                q = q.to(tl.float32)
            w = tl.load(w_ptr + t64 * stride_wt + heads, mask=head_ok, other=0.0)
            if DOT == 2:
                logits = tl.dot(keys, tl.trans(q), input_precision="ieee")  # [BLOCK_N, BLOCK_H]
            else:
                logits = tl.dot(keys, tl.trans(q))
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
    indexer_score_kernel[grid](
        q, q.stride(0), q.stride(1),
        weights, weights.stride(0),
        index_pages, index_pages.stride(0), index_pages.stride(1),
        block_table, block_table.stride(0),
        req_ids, positions,
        out, out.stride(0),
        tokens, heads, max_context, index_pages.shape[0], block_table.shape[1], index_pages.shape[1],
        FMT=INDEX_CODES[index_fmt], DOT=dot, BLOCK_H=block_h, BLOCK_N=block_n, GROUP=group,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
