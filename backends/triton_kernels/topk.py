"""Exact top-k per row by radix select, with the tie rule: among equal scores the smaller index wins.

Scores become order-preserving 32-bit keys (``-0.0`` folded into ``+0.0``), read as four 8-bit
digits from the top. One program owns one row and never sorts it:

1. ``ROW_LEVELS`` (1 or 2) passes over the whole row, each a 256-bin histogram of the next digit
   of the keys that still match the prefix found so far, pin the top 8 or 16 bits of the k-th
   largest key (a small histogram is cheap; real index scores crowd into few exponents, so two
   digits keep the candidate list short where one would not);
2. one more pass writes every index whose top digits beat that prefix straight to the output and
   appends the ones equal to it (in index order) to a scratch row;
3. one histogram per remaining digit over that candidate list pins the exact k-th key ``τ``;
4. a last pass over the candidates writes those above ``τ`` and the first ones equal to ``τ``
   in index order, which is the tie rule.

Entries at or past ``lengths[t]`` and ``-inf`` entries are never chosen; short rows are padded
with -1. Output order: the pass-2 winners in index order, then the candidate winners in index
order. ``EMIT_SLOTS`` fuses position-to-slot translation into the write (for DSA attention).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .topk_common import _digit_histogram, _emit, _matches, _pad, _resolve_candidates, _sort_key, _threshold
from dsahal.kernel_launch import wrap_launched

# Counts and sizes that vary from call to call are not specialised on (Triton would compile a
# variant per value pattern: ==1, multiple of 16); strides stay specialised for wide loads.
SIZE_ARGS = ("max_blocks", "block_tokens", "N", "k")


@triton.jit(do_not_specialize=SIZE_ARGS)
def topk_kernel(
    scores_ptr, stride_st,  # [T, N] fp32
    lengths_ptr,  # [T]
    out_ptr, stride_ot,  # [T, k] int32
    scratch_ptr, stride_xt,  # [T, N] int32 candidate indices
    req_ptr, block_table_ptr, stride_bt, max_blocks, block_tokens,  # used when EMIT_SLOTS
    N, k,
    EMIT_SLOTS: tl.constexpr, CHUNK: tl.constexpr, ROW_LEVELS: tl.constexpr,
):
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

    # 1. The top ROW_LEVELS digits of the k-th largest key, from histograms over the whole row.
    prefix = tl.full([], 0, tl.uint32)
    need = k
    num_valid = length
    for level in tl.static_range(ROW_LEVELS):
        hist = tl.zeros([256], tl.int32)
        for c0 in range(0, length, CHUNK):
            cols = c0 + lanes
            x = tl.load(score_row + cols, mask=cols < length, other=float("-inf"))
            key = _sort_key(x)
            member = (cols < length) & (x != float("-inf")) & _matches(key, prefix, level)
            hist += _digit_histogram(key, member, level)
        if level == 0:
            num_valid = tl.sum(hist, axis=0)
        chosen, above = _threshold(hist, need)
        prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * level))
        need = need - above
    cut = num_valid > k  # else every valid entry wins: no candidates, no ties
    # as lane vectors: the interpreter mishandles masks that mix tensors and scalars
    take_all_lanes = (lanes * 0 + num_valid) <= k

    # 2. Winners by their top digits to the output, the prefix's members to the scratch row, both in
    #    index order.
    written = 0
    candidates = 0
    for c0 in range(0, length, CHUNK):
        cols = c0 + lanes
        x = tl.load(score_row + cols, mask=cols < length, other=float("-inf"))
        valid = (cols < length) & (x != float("-inf"))
        top = _sort_key(x) >> (32 - 8 * ROW_LEVELS)
        top_prefix = prefix >> (32 - 8 * ROW_LEVELS)
        win = valid & ((top > top_prefix) | take_all_lanes)
        cand = valid & (top == top_prefix) & ~take_all_lanes
        # one scan for both lists: winners counted in the low 16 bits, candidates in the high ones
        packed = tl.cumsum(win.to(tl.int32) + (cand.to(tl.int32) << 16), axis=0)
        _emit(out_row, written + (packed & 0xFFFF) - 1, cols, win, req, block_table_ptr, stride_bt,
              max_blocks, block_tokens, EMIT_SLOTS)
        tl.store(cand_row + candidates + (packed >> 16) - 1, cols, mask=cand)
        total = tl.max(packed, axis=0)  # the scan's last element
        written += total & 0xFFFF
        candidates += total >> 16

    if cut:
        written = _resolve_candidates(score_row, cand_row, out_row, candidates, prefix, need, written, req,
                                      block_table_ptr, stride_bt, max_blocks, block_tokens, lanes, EMIT_SLOTS,
                                      ROW_LEVELS)
    _pad(out_row, written, k, lanes)


METHODS = ("radix", "bound", "groups", "registers")


def topk(scores, lengths, k, *, chunk=2048, row_levels=2, num_warps=8, emit_slots=None, scratch=None,
         segments=1, method="radix", group=None, finish_chunk=512, finish_warps=4, steps=16, group_size=None,
         batch=64, segment_histograms=False, compact_prefetch=False, group_maxima=None):
    """Launch :func:`topk_kernel` (or, with ``segments > 1``, :mod:`.topk_split`'s passes; or, with
    ``method="bound"``, :mod:`.topk_bound`'s max-bound filter).

    Args:
        scores: ``[T, N]`` fp32 (unit stride in N; the bound and groups methods copy rows that do not start 16-byte
            aligned with a row stride a multiple of 16: :func:`~.alignment.aligned_rows`). lengths: ``[T]`` int32 in
            ``[0, N]``.
        k: entries to keep per row.
        chunk: entries per step (power of two, <= 16384: a chunk's two counts share one int32 scan).
        row_levels: key digits (8 bits each) resolved over the whole row before the candidate list
            is cut (1 or 2).
        emit_slots: ``(req_ids [T], block_table [B, max_blocks], block_tokens)`` to write physical
            slots instead of positions (-1 where unmapped).
        scratch: optional ``[T, N]`` int32 work buffer.
        segments: programs per row for the passes over the whole row (1: one program per row;
            more keep the GPU busy when rows are few and long). The result is the same bit for bit.
        method: ``"radix"`` (the kernels above) or ``"bound"`` (:func:`.topk_bound.topk_bound`: a lane-max
            lower bound on the k-th score, then radix select over the few entries above it; uses
            ``chunk``, ``num_warps``, ``group``, ``finish_chunk``, ``finish_warps``, ``segment_histograms``;
            output in index order),
            or ``"groups"`` (:func:`.topk_groups.topk_groups`: the bound from groups of consecutive entries, the
            second pass reads only the live groups; uses ``chunk``, ``steps``, ``group_size``, ``batch``,
            ``num_warps``, ``finish_chunk``, ``finish_warps``, ``segment_histograms``, ``compact_prefetch``; the
            same output as ``"bound"``),
            or ``"registers"`` (:func:`.topk_registers.topk_registers`: rows of at most
            :data:`.topk_registers.MAX_WIDTH` scores held whole in one program's registers, read once; uses
            ``num_warps`` (None: by the width); the same output as ``"bound"``).
        group_maxima: (``method="groups"`` only) the rows' group maxima made by the scores' producer, which the
            groups method then does not make (:func:`.topk_groups.topk_groups`' ``maxima``,
            :func:`.topk_groups.maxima_layout`); the same output.

    Returns:
        ``[T, k]`` int32 indices (or slots), -1 padding last.
    """
    if method not in METHODS:
        raise ValueError(f"dsahal.topk (triton): argument 'method' expected one of {METHODS}, got {method!r}")
    if group_maxima is not None and method != "groups":
        raise ValueError(f"dsahal.topk (triton): argument 'group_maxima' is read by method 'groups' only, got "
                         f"method {method!r}")
    tokens, width = scores.shape
    scores = scores if scores.stride(-1) == 1 else scores.contiguous()
    out = torch.empty((tokens, k), dtype=torch.int32, device=scores.device)
    if tokens == 0:
        return out
    if emit_slots is None:
        req_ids, block_table, block_tokens = lengths, lengths.view(1, -1), 1
        emit = False
    else:
        req_ids, block_table, block_tokens = emit_slots
        emit = True
    if method == "registers":
        from .topk_registers import topk_registers

        return topk_registers(scores, lengths, k, out, emit, req_ids, block_table, block_tokens, num_warps=num_warps)
    if scratch is None:
        scratch = torch.empty((tokens, max(width, 1)), dtype=torch.int32, device=scores.device)
    if method == "bound":
        from .topk_bound import topk_bound

        return topk_bound(scores, lengths, k, out, emit, req_ids, block_table, block_tokens, chunk=chunk, group=group,
                          finish_chunk=finish_chunk, num_warps=num_warps, finish_warps=finish_warps,
                          segment_histograms=segment_histograms, scratch=scratch)
    if method == "groups":
        from .topk_groups import topk_groups

        return topk_groups(scores, lengths, k, out, emit, req_ids, block_table, block_tokens, chunk=chunk,
                           steps=steps, group_size=group_size, batch=batch, finish_chunk=finish_chunk,
                           num_warps=num_warps, finish_warps=finish_warps, segment_histograms=segment_histograms,
                           compact_prefetch=compact_prefetch, scratch=scratch, maxima=group_maxima)
    if segments > 1 and width > chunk:  # (a row of one chunk has nothing to split)
        from .topk_split import topk_split

        return topk_split(scores, lengths, k, out, scratch, emit, req_ids, block_table, block_tokens,
                          segments=segments, chunk=chunk, row_levels=row_levels, num_warps=num_warps)
    topk_kernel[(tokens,)](
        scores, scores.stride(0), lengths, out, out.stride(0), scratch, scratch.stride(0),
        req_ids, block_table, block_table.stride(0), block_table.shape[1], block_tokens,
        width, k,
        EMIT_SLOTS=emit, CHUNK=chunk, ROW_LEVELS=row_levels, num_warps=num_warps,
    )
    return out


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
