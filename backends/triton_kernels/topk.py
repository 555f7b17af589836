"""Exact top-k per row by radix select, with the tie rule: among equal scores the smaller index wins.

Scores become order-preserving 32-bit keys (``-0.0`` folded into ``+0.0``). One program owns one
row and never sorts it:

1. histogram of the top ``BITS1`` key bits over the row; the bin holding the k-th largest key
   is the threshold bin;
2. one more pass writes every index above the threshold bin straight to the output and
   appends the threshold bin's indices (in index order) to a scratch row;
3. two histograms over that (usually small) candidate list pin the exact k-th key ``τ``;
4. a last pass over the candidates writes those above ``τ`` and the first ones equal to ``τ``
   in index order, which is the tie rule.

Entries at or past ``lengths[t]`` and ``-inf`` entries are never chosen; short rows are padded
with -1. Output order: the level-1 winners in index order, then the candidate winners in index
order. ``EMIT_SLOTS`` fuses position-to-slot translation into the write (for DSA attention).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sort_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0.0 treated as +0.0)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    flip = (bits >> 31) | -2147483648  # all ones for negatives, only the sign bit otherwise
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _threshold(hist, need, NUM_BINS: tl.constexpr):
    """Highest bin ``b`` with at least ``need`` entries in bins ``>= b``; entries strictly above it."""
    bins = tl.arange(0, NUM_BINS)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    chosen = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
    above = tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
    return chosen, above


@triton.jit
def _emit(out_row, where, positions, mask, req, block_table_ptr, stride_bt, max_blocks, block_tokens,
          EMIT_SLOTS: tl.constexpr):
    """Write ``positions`` (or their physical slots) at output columns ``where``."""
    if EMIT_SLOTS:
        logical = positions // block_tokens
        block = tl.load(block_table_ptr + req * stride_bt + logical, mask=mask & (logical < max_blocks), other=-1)
        value = tl.where(block >= 0, block * block_tokens + positions % block_tokens, -1)
    else:
        value = positions
    tl.store(out_row + where, value, mask=mask)


@triton.jit
def topk_kernel(
    scores_ptr, stride_st,  # [T, N] fp32
    lengths_ptr,  # [T]
    out_ptr, stride_ot,  # [T, k] int32
    scratch_ptr, stride_xt,  # [T, N] int32 candidate indices
    req_ptr, block_table_ptr, stride_bt, max_blocks, block_tokens,  # used when EMIT_SLOTS
    N, k,
    EMIT_SLOTS: tl.constexpr, CHUNK: tl.constexpr, BITS1: tl.constexpr, BITS2: tl.constexpr,
):
    BITS3: tl.constexpr = 32 - BITS1 - BITS2
    row = tl.program_id(0).to(tl.int64)
    score_row = scores_ptr + row * stride_st
    out_row = out_ptr + row * stride_ot
    cand_row = scratch_ptr + row * stride_xt
    length = tl.minimum(tl.load(lengths_ptr + row).to(tl.int32), N)
    length = tl.maximum(length, 0)
    req = 0
    if EMIT_SLOTS:
        req = tl.load(req_ptr + row).to(tl.int32)
    lanes = tl.arange(0, CHUNK)

    # Level 1: histogram of the top bits. Invalid lanes go to bin 0, which no finite score reaches.
    hist = tl.zeros([1 << BITS1], tl.int32)
    for c0 in range(0, length, CHUNK):
        cols = c0 + lanes
        x = tl.load(score_row + cols, mask=cols < length, other=float("-inf"))
        valid = (cols < length) & (x != float("-inf"))
        top = tl.where(valid, _sort_key(x) >> (32 - BITS1), 0).to(tl.int32)
        hist += tl.histogram(top, 1 << BITS1)
    bins1 = tl.arange(0, 1 << BITS1)
    hist = tl.where(bins1 == 0, 0, hist)
    num_valid = tl.sum(hist, axis=0)
    take_all = num_valid <= k
    bin1, above1 = _threshold(hist, k, 1 << BITS1)
    bin1 = tl.where(take_all, 0, bin1)

    # Level-1 winners to the output, threshold-bin members to the scratch row, both in index order.
    written = 0
    candidates = 0
    for c0 in range(0, length, CHUNK):
        cols = c0 + lanes
        x = tl.load(score_row + cols, mask=cols < length, other=float("-inf"))
        valid = (cols < length) & (x != float("-inf"))
        top = (_sort_key(x) >> (32 - BITS1)).to(tl.int32)
        win = valid & (top > bin1)
        cand = valid & (top == bin1) & (top > 0)  # bin 0: everything was taken
        # one scan for both lists: winners counted in the low 16 bits, candidates in the high ones
        packed = tl.cumsum(win.to(tl.int32) + (cand.to(tl.int32) << 16), axis=0)
        _emit(out_row, written + (packed & 0xFFFF) - 1, cols, win, req, block_table_ptr, stride_bt,
              max_blocks, block_tokens, EMIT_SLOTS)
        tl.store(cand_row + candidates + (packed >> 16) - 1, cols, mask=cand)
        total = tl.max(packed, axis=0)  # the scan's last element
        written += total & 0xFFFF
        candidates += total >> 16

    need = tl.where(take_all, 0, k - written)
    if need > 0:
        # Level 2: the middle bits of the candidates.
        hist2 = tl.zeros([1 << BITS2], tl.int32)
        for c0 in range(0, candidates, CHUNK):
            idx = c0 + lanes
            in_list = idx < candidates
            col = tl.load(cand_row + idx, mask=in_list, other=0)
            key = _sort_key(tl.load(score_row + col, mask=in_list, other=0.0))
            mid = tl.where(in_list, (key >> BITS3) & ((1 << BITS2) - 1), 0).to(tl.int32)
            hist2 += tl.histogram(mid, 1 << BITS2)
            hist2 -= tl.where(tl.arange(0, 1 << BITS2) == 0, tl.sum((~in_list).to(tl.int32), axis=0), 0)
        bin2, above2 = _threshold(hist2, need, 1 << BITS2)
        need2 = need - above2
        # Level 3: the low bits of the candidates in the threshold bin of level 2.
        hist3 = tl.zeros([1 << BITS3], tl.int32)
        for c0 in range(0, candidates, CHUNK):
            idx = c0 + lanes
            in_list = idx < candidates
            col = tl.load(cand_row + idx, mask=in_list, other=0)
            key = _sort_key(tl.load(score_row + col, mask=in_list, other=0.0))
            match = in_list & (((key >> BITS3) & ((1 << BITS2) - 1)).to(tl.int32) == bin2)
            low = tl.where(match, key & ((1 << BITS3) - 1), 0).to(tl.int32)
            hist3 += tl.histogram(low, 1 << BITS3)
            hist3 -= tl.where(tl.arange(0, 1 << BITS3) == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
        bin3, above3 = _threshold(hist3, need2, 1 << BITS3)
        ties_to_take = need2 - above3
        tau = ((bin1.to(tl.uint32) << (32 - BITS1)) | (bin2.to(tl.uint32) << BITS3) | bin3.to(tl.uint32))
        # Final pass: above tau always, equal to tau in index order until the quota is filled.
        ties_seen = 0
        for c0 in range(0, candidates, CHUNK):
            idx = c0 + lanes
            in_list = idx < candidates
            col = tl.load(cand_row + idx, mask=in_list, other=0)
            key = _sort_key(tl.load(score_row + col, mask=in_list, other=0.0))
            tie = in_list & (key == tau)
            tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), axis=0)
            win = (in_list & (key > tau)) | (tie & (tie_rank <= ties_to_take))
            win_i = win.to(tl.int32)
            _emit(out_row, written + tl.cumsum(win_i, axis=0) - 1, col, win, req, block_table_ptr, stride_bt,
                  max_blocks, block_tokens, EMIT_SLOTS)
            written += tl.sum(win_i, axis=0)
            ties_seen += tl.sum(tie.to(tl.int32), axis=0)

    for c0 in range(written, k, CHUNK):
        cols = c0 + lanes
        tl.store(out_row + cols, tl.full([CHUNK], -1, tl.int32), mask=cols < k)


def topk(scores, lengths, k, *, chunk=2048, bits1=8, bits2=12, num_warps=8, emit_slots=None, scratch=None):
    """Launch :func:`topk_kernel`.

    Args:
        scores: ``[T, N]`` fp32 (unit stride in N). lengths: ``[T]`` int32 in ``[0, N]``.
        k: entries to keep per row.
        chunk: entries per step (power of two, < 65536); bits1/bits2: key bits resolved by levels 1
            and 2 (level 1 runs over the whole row: few bins keep its histogram cheap).
        emit_slots: ``(req_ids [T], block_table [B, max_blocks], block_tokens)`` to write physical
            slots instead of positions (-1 where unmapped).
        scratch: optional ``[T, N]`` int32 work buffer.

    Returns:
        ``[T, k]`` int32 indices (or slots), -1 padding last.
    """
    tokens, width = scores.shape
    scores = scores if scores.stride(-1) == 1 else scores.contiguous()
    out = torch.empty((tokens, k), dtype=torch.int32, device=scores.device)
    if tokens == 0:
        return out
    if scratch is None:
        scratch = torch.empty((tokens, max(width, 1)), dtype=torch.int32, device=scores.device)
    if emit_slots is None:
        req_ids, block_table, block_tokens = lengths, lengths.view(1, -1), 1
        emit = False
    else:
        req_ids, block_table, block_tokens = emit_slots
        emit = True
    topk_kernel[(tokens,)](
        scores, scores.stride(0), lengths, out, out.stride(0), scratch, scratch.stride(0),
        req_ids, block_table, block_table.stride(0), block_table.shape[1], block_tokens,
        width, k,
        EMIT_SLOTS=emit, CHUNK=chunk, BITS1=bits1, BITS2=bits2, num_warps=num_warps,
    )
    return out
