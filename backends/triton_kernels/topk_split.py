"""Exact top-k with each row split over several programs (long rows, few rows).

The same radix select as :mod:`.topk` (8-bit digits, ``ROW_LEVELS`` of them resolved over the whole
row, the rest over a candidate list, the tie rule: equal scores go to the smaller index), but the
passes over the whole row run ``T x S`` programs, one per (row, segment of ``seg_len`` entries),
so a few hundred rows of 128K entries keep every SM busy. The passes must agree on the prefix found
so far, which needs every segment's histogram: each pass is its own launch, and every program
re-derives the prefix from the stored histograms (a few KB) instead of a separate reduction launch:

1. ``split_histogram_kernel`` per level: 256-bin histogram of the level's digit over the segment's
   entries that match the prefix -> ``hist[T, ROW_LEVELS, S, 256]``;
2. ``split_count_kernel``: per segment, how many entries beat the prefix (winners) and how many
   equal it (candidates) -> ``counts[T, S, 2]``;
3. ``split_write_kernel``: winners and candidates written in index order at offsets summed from
   the earlier segments' counts;
4. ``split_finish_kernel`` (one program per row): the remaining digits over the candidates, the
   tie quota, -1 padding — :func:`.topk_common._resolve_candidates`, shared with the one-program kernel.

No atomics: the output is bitwise the same run to run and whatever else is in the batch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .topk_common import _digit_histogram, _emit, _matches, _pad, _resolve_candidates, _sort_key, _threshold
from dsahal.kernel_launch import wrap_launched

SIZE_ARGS = ("max_blocks", "block_tokens", "N", "k", "seg_len", "segments")


@triton.jit
def _row_length(lengths_ptr, row, N):
    return tl.maximum(tl.minimum(tl.load(lengths_ptr + row).to(tl.int32), N), 0)


@triton.jit
def _prefix(hist_row, segments, k, LEVELS: tl.constexpr):
    """From the stored histograms of the first ``LEVELS`` digits of one row: (prefix, entries still
    needed within it, valid entries of the row). ``hist_row``: ``[ROW_LEVELS, S, 256]`` int32."""
    bins = tl.arange(0, 256)
    prefix = tl.full([], 0, tl.uint32)
    need = k
    num_valid = 0
    for level in tl.static_range(LEVELS):
        total = tl.zeros([256], tl.int32)
        for s in range(segments):
            total += tl.load(hist_row + (level * segments + s) * 256 + bins)
        if level == 0:
            num_valid = tl.sum(total, axis=0)
        chosen, above = _threshold(total, need)
        prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * level))
        need = need - above
    return prefix, need, num_valid


@triton.jit(do_not_specialize=SIZE_ARGS)
def split_histogram_kernel(
    scores_ptr, stride_st, lengths_ptr, hist_ptr,  # hist [T, ROW_LEVELS, S, 256] int32
    N, k, seg_len, segments,
    LEVEL: tl.constexpr, ROW_LEVELS: tl.constexpr, CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    hist_row = hist_ptr + row * (ROW_LEVELS * segments * 256)
    prefix, need, num_valid = _prefix(hist_row, segments, k, LEVEL)
    length = _row_length(lengths_ptr, row, N)
    score_row = scores_ptr + row * stride_st
    lanes = tl.arange(0, CHUNK)
    start = seg * seg_len
    end = tl.minimum(start + seg_len, length)
    hist = tl.zeros([256], tl.int32)
    for c0 in range(start, end, CHUNK):
        cols = c0 + lanes
        x = tl.load(score_row + cols, mask=cols < end, other=float("-inf"))
        key = _sort_key(x)
        member = (cols < end) & (x != float("-inf")) & _matches(key, prefix, LEVEL)
        hist += _digit_histogram(key, member, LEVEL)
    tl.store(hist_row + (LEVEL * segments + seg) * 256 + tl.arange(0, 256), hist)


@triton.jit
def _counted(counts_ptr, row, segments, upto):
    """(winners, candidates) of the row's segments ``0 .. upto - 1`` from ``counts [T, S, 2]``."""
    winners = 0
    candidates = 0
    for s in range(upto):
        winners += tl.load(counts_ptr + (row * segments + s) * 2)
        candidates += tl.load(counts_ptr + (row * segments + s) * 2 + 1)
    return winners, candidates


@triton.jit
def _split_lists(x, cols, end, prefix, k, num_valid, ROW_LEVELS: tl.constexpr):
    """Per lane: a winner by its top digits, or a candidate (top digits equal to the prefix)."""
    valid = (cols < end) & (x != float("-inf"))
    top = _sort_key(x) >> (32 - 8 * ROW_LEVELS)
    top_prefix = prefix >> (32 - 8 * ROW_LEVELS)
    take_all_lanes = (cols * 0 + num_valid) <= k  # lane vector: see topk_kernel
    win = valid & ((top > top_prefix) | take_all_lanes)
    cand = valid & (top == top_prefix) & ~take_all_lanes
    return win, cand


@triton.jit(do_not_specialize=SIZE_ARGS)
def split_count_kernel(
    scores_ptr, stride_st, lengths_ptr, hist_ptr, counts_ptr,  # counts [T, S, 2] int32
    N, k, seg_len, segments,
    ROW_LEVELS: tl.constexpr, CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    prefix, need, num_valid = _prefix(hist_ptr + row * (ROW_LEVELS * segments * 256), segments, k, ROW_LEVELS)
    length = _row_length(lengths_ptr, row, N)
    score_row = scores_ptr + row * stride_st
    lanes = tl.arange(0, CHUNK)
    start = seg * seg_len
    end = tl.minimum(start + seg_len, length)
    winners = 0
    candidates = 0
    for c0 in range(start, end, CHUNK):
        cols = c0 + lanes
        x = tl.load(score_row + cols, mask=cols < end, other=float("-inf"))
        win, cand = _split_lists(x, cols, end, prefix, k, num_valid, ROW_LEVELS)
        winners += tl.sum(win.to(tl.int32), axis=0)
        candidates += tl.sum(cand.to(tl.int32), axis=0)
    count_row = counts_ptr + (row * segments + seg) * 2
    tl.store(count_row, winners)
    tl.store(count_row + 1, candidates)


@triton.jit(do_not_specialize=SIZE_ARGS)
def split_write_kernel(
    scores_ptr, stride_st, lengths_ptr, hist_ptr, counts_ptr,
    out_ptr, stride_ot, scratch_ptr, stride_xt,
    req_ptr, block_table_ptr, stride_bt, max_blocks, block_tokens,
    N, k, seg_len, segments,
    EMIT_SLOTS: tl.constexpr, ROW_LEVELS: tl.constexpr, CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    prefix, need, num_valid = _prefix(hist_ptr + row * (ROW_LEVELS * segments * 256), segments, k, ROW_LEVELS)
    length = _row_length(lengths_ptr, row, N)
    score_row = scores_ptr + row * stride_st
    out_row = out_ptr + row * stride_ot
    cand_row = scratch_ptr + row * stride_xt
    req = 0
    if EMIT_SLOTS:
        req = tl.load(req_ptr + row).to(tl.int32)
    written, candidates = _counted(counts_ptr, row, segments, seg)  # what the earlier segments write
    lanes = tl.arange(0, CHUNK)
    start = seg * seg_len
    end = tl.minimum(start + seg_len, length)
    for c0 in range(start, end, CHUNK):
        cols = c0 + lanes
        x = tl.load(score_row + cols, mask=cols < end, other=float("-inf"))
        win, cand = _split_lists(x, cols, end, prefix, k, num_valid, ROW_LEVELS)
        packed = tl.cumsum(win.to(tl.int32) + (cand.to(tl.int32) << 16), axis=0)  # as in topk_kernel
        _emit(out_row, written + (packed & 0xFFFF) - 1, cols, win, req, block_table_ptr, stride_bt,
              max_blocks, block_tokens, EMIT_SLOTS)
        tl.store(cand_row + candidates + (packed >> 16) - 1, cols, mask=cand)
        total = tl.max(packed, axis=0)
        written += total & 0xFFFF
        candidates += total >> 16


@triton.jit(do_not_specialize=SIZE_ARGS)
def split_finish_kernel(
    scores_ptr, stride_st, hist_ptr, counts_ptr,
    out_ptr, stride_ot, scratch_ptr, stride_xt,
    req_ptr, block_table_ptr, stride_bt, max_blocks, block_tokens,
    N, k, seg_len, segments,
    EMIT_SLOTS: tl.constexpr, ROW_LEVELS: tl.constexpr, CHUNK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    prefix, need, num_valid = _prefix(hist_ptr + row * (ROW_LEVELS * segments * 256), segments, k, ROW_LEVELS)
    out_row = out_ptr + row * stride_ot
    written, candidates = _counted(counts_ptr, row, segments, segments)
    lanes = tl.arange(0, CHUNK)
    if num_valid > k:
        req = 0
        if EMIT_SLOTS:
            req = tl.load(req_ptr + row).to(tl.int32)
        written = _resolve_candidates(scores_ptr + row * stride_st, scratch_ptr + row * stride_xt, out_row,
                                      candidates, prefix, need, written, req, block_table_ptr, stride_bt,
                                      max_blocks, block_tokens, lanes, EMIT_SLOTS, ROW_LEVELS)
    _pad(out_row, written, k, lanes)


def topk_split(scores, lengths, k, out, scratch, emit, req_ids, block_table, block_tokens, *, segments, chunk,
               row_levels, num_warps):
    """Launch the four passes for ``scores [T, N]`` into ``out [T, k]`` (arguments as :func:`.topk.topk`)."""
    tokens, width = scores.shape
    seg_len = triton.cdiv(triton.cdiv(width, segments), chunk) * chunk  # whole chunks per segment
    segments = triton.cdiv(width, seg_len)
    hist = torch.empty((tokens, row_levels, segments, 256), dtype=torch.int32, device=scores.device)
    counts = torch.empty((tokens, segments, 2), dtype=torch.int32, device=scores.device)
    sizes = (width, k, seg_len, segments)
    grid = (tokens, segments)
    for level in range(row_levels):
        split_histogram_kernel[grid](scores, scores.stride(0), lengths, hist, *sizes, LEVEL=level,
                                     ROW_LEVELS=row_levels, CHUNK=chunk, num_warps=num_warps)
    split_count_kernel[grid](scores, scores.stride(0), lengths, hist, counts, *sizes, ROW_LEVELS=row_levels,
                             CHUNK=chunk, num_warps=num_warps)
    emit_args = (req_ids, block_table, block_table.stride(0), block_table.shape[1], block_tokens)
    split_write_kernel[grid](scores, scores.stride(0), lengths, hist, counts, out, out.stride(0), scratch,
                             scratch.stride(0), *emit_args, *sizes, EMIT_SLOTS=emit, ROW_LEVELS=row_levels,
                             CHUNK=chunk, num_warps=num_warps)
    split_finish_kernel[(tokens,)](scores, scores.stride(0), hist, counts, out, out.stride(0), scratch,
                                   scratch.stride(0), *emit_args, *sizes, EMIT_SLOTS=emit, ROW_LEVELS=row_levels,
                                   CHUNK=chunk, num_warps=num_warps)
    return out


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
