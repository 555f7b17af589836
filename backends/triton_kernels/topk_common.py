"""The radix-select pieces shared by the one-program top-k (:mod:`.topk`) and the split-row one
(:mod:`.topk_split`): order-preserving 32-bit keys, 8-bit digit histograms, the threshold bin, the
candidate resolution with the tie rule (equal scores: the smaller index wins), output and padding.

Both kernels import these ``@triton.jit`` helpers from here, so neither imports the other at load time.
"""
from __future__ import annotations

import triton
import triton.language as tl

DIGIT_BITS = 8
NUM_BINS = 1 << DIGIT_BITS


@triton.jit
def _sort_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (-0.0 treated as +0.0)."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    flip = (bits >> 31) | -2147483648  # all ones for negatives, only the sign bit otherwise
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _matches(key, prefix, LEVEL: tl.constexpr):
    """Whether the top ``LEVEL`` digits of ``key`` equal those of ``prefix`` (always true at level 0)."""
    if LEVEL == 0:
        return key == key
    else:
        return (key >> (32 - 8 * LEVEL)) == (prefix >> (32 - 8 * LEVEL))


@triton.jit
def _digit_histogram(key, member, LEVEL: tl.constexpr):
    """256-bin histogram of digit ``LEVEL`` over the lanes where ``member``; others are not counted."""
    digit = tl.where(member, (key >> (24 - 8 * LEVEL)) & 255, 0).to(tl.int32)
    hist = tl.histogram(digit, 256)
    # lanes outside the set were put in bin 0: take them out again
    return hist - tl.where(tl.arange(0, 256) == 0, tl.sum((~member).to(tl.int32), axis=0), 0)


@triton.jit
def _threshold(hist, need):
    """Highest bin ``b`` with at least ``need`` entries in bins ``>= b``; entries strictly above it."""
    bins = tl.arange(0, 256)
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
def _resolve_candidates(score_row, cand_row, out_row, candidates, prefix, need, written, req, block_table_ptr,
                        stride_bt, max_blocks, block_tokens, lanes, EMIT_SLOTS: tl.constexpr,
                        ROW_LEVELS: tl.constexpr):
    """Steps 3 and 4 over the ``candidates`` indices in ``cand_row`` (index order), whose top
    ``ROW_LEVELS`` digits equal ``prefix``'s; ``need`` of them are still to be chosen and ``written``
    outputs exist. Returns the new count of outputs."""
    CHUNK: tl.constexpr = lanes.shape[0]
    # 3. The remaining digits over the candidate list.
    for level in tl.static_range(ROW_LEVELS, 4):
        hist = tl.zeros([256], tl.int32)
        for c0 in range(0, candidates, CHUNK):
            idx = c0 + lanes
            in_list = idx < candidates
            col = tl.load(cand_row + idx, mask=in_list, other=0)
            key = _sort_key(tl.load(score_row + col, mask=in_list, other=0.0))
            hist += _digit_histogram(key, in_list & _matches(key, prefix, level), level)
        chosen, above = _threshold(hist, need)
        prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * level))
        need = need - above
    # 4. Above tau always, equal to tau in index order until the quota (need) is filled.
    ties_seen = 0
    for c0 in range(0, candidates, CHUNK):
        idx = c0 + lanes
        in_list = idx < candidates
        col = tl.load(cand_row + idx, mask=in_list, other=0)
        key = _sort_key(tl.load(score_row + col, mask=in_list, other=0.0))
        tie = in_list & (key == prefix)
        tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), axis=0)
        win = (in_list & (key > prefix)) | (tie & (tie_rank <= need))
        win_i = win.to(tl.int32)
        _emit(out_row, written + tl.cumsum(win_i, axis=0) - 1, col, win, req, block_table_ptr, stride_bt,
              max_blocks, block_tokens, EMIT_SLOTS)
        written += tl.sum(win_i, axis=0)
        ties_seen += tl.sum(tie.to(tl.int32), axis=0)
    return written


@triton.jit
def _pad(out_row, written, k, lanes):
    """-1 in output columns ``written .. k - 1`` (rows with fewer than k valid entries)."""
    CHUNK: tl.constexpr = lanes.shape[0]
    for c0 in range(written, k, CHUNK):
        cols = c0 + lanes
        tl.store(out_row + cols, tl.full([CHUNK], -1, tl.int32), mask=cols < k)
