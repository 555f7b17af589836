"""Exact top-k from a bound on groups of consecutive entries: the second pass reads only the live groups.

A variant of :mod:`.topk_bound` (same threshold and finish kernels, same result bit for bit: the tie
rule's set in index order). There a lane's maximum covers entries ``CHUNK`` apart, so the compaction
pass must still read and scan the whole row. Here a *group* is ``G`` consecutive entries:

1. ``group_max_kernel`` (``T x S``): the max of every group -> ``maxima[T, S, seg_len / G]`` (key 0 for a
   group with no valid entry);
2. :func:`.topk_bound.bound_threshold_kernel` (``T``): ``L`` = top 16 bits of the k-th largest group max
   (``τ >= L``: the k largest maxima are k distinct entries);
3. ``group_compact_kernel`` (``T x S``): the segment's *live* groups (max ``>= L``; on i.i.d. scores with
   ``G k <= N / 4`` about a quarter of them) are listed in index order, then only their entries are read
   (``G`` consecutive floats: whole sectors) and those with key ``>= L`` appended to the segment's
   survivor region, as in :mod:`.topk_bound`;
4. :func:`.topk_bound.bound_finish_kernel` (``T``): exact ``τ`` over the survivors, the tie rule, padding.

With ``segment_histograms`` the two per-row kernels read one histogram fewer each, from the ``T x S`` passes
before them: the first pass stores each segment's 256-bin histogram of its maxima's top 8 key bits, which the
threshold kernel sums instead of reading every maximum for its first digit, and the compaction stores each
segment's histogram of its survivors' top 16 key bits relative to the bound, which the finish sums instead of its
first pass over the survivors. Each is one histogram of what the program stored, after its reads (L2-hot), not one a
step: Triton's histogram costs ~600 instructions a warp whatever its length. The same bound and ``τ``, bit for bit.
With ``compact_prefetch`` the compaction gathers a batch's scores, and loads the group ids of the batch after it, one
step ahead of the batch's scan (Triton does not pipeline that loop: its loads hang off the live list it just wrote):
the same batches in the same order, the same bits.

Scores with locality (neighbouring positions alike) put the best entries in fewer groups: the bound
is looser and more groups are live (still exact). Four launches, no atomics, no host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .alignment import aligned_rows
from .topk_bound import (BOUND_LEVELS, SURVIVOR_HIST_CHUNK, _keep, _row_length, _scratch, _segment_done,
                         bound_finish_kernel, bound_threshold_kernel, segment_histogram_buffers)
from .topk_common import _digit_histogram, _sort_key
from dsahal.kernel_launch import wrap_launched

SIZE_ARGS = ("N", "seg_len")
# group sizes a scores' producer may make the maxima for (the fused indexer -> top-k: whole groups of its 64-key tiles)
MAXIMA_GROUPS = (8, 16, 32, 64)
# segment_histograms: group maxima a step of the first pass's histogram (48 registers on sm_90 with Triton 3.6, 35
# without; the compaction's survivors: topk_bound.SURVIVOR_HIST_CHUNK)
MAXIMA_HIST_CHUNK = 1024
# compile_budget's batch-invariant facts (those of topk_bound's threshold and finish kernels, which this module launches
# too, are topk_bound's): the scores (aligned by :func:`topk_groups`), the buffers it allocates, and the maxima's row
# stride (fixed by the call's width and configuration, the same whichever rows a batch holds)
CACHE_ARGS = {"group_max_kernel": ("stride_mt",), "group_compact_kernel": ("stride_mt",)}
LAUNCHER_ALIGNED_ARGS = {"group_max_kernel": ("scores_ptr", "stride_st", "maxima_ptr", "hist_ptr"),
                         "group_compact_kernel": ("scores_ptr", "stride_st", "maxima_ptr", "live_ptr", "hist_ptr")}


@triton.jit(do_not_specialize=SIZE_ARGS)
def group_max_kernel(
    scores_ptr, stride_st, lengths_ptr,
    maxima_ptr, stride_mt,  # [T, S * seg_len / G] int32 keys (0: no valid entry in the group)
    hist_ptr,  # SEG_HIST: [T, S, 256] int32, the segment's histogram of its non-empty maxima's top 8 key bits
    N, seg_len,
    ROWS: tl.constexpr, G: tl.constexpr,  # ROWS groups of G entries per step
    SEG_HIST: tl.constexpr, GROUPS: tl.constexpr,  # GROUPS = seg_len / G (used with SEG_HIST)
    HIST_CHUNK: tl.constexpr,  # maxima a histogram step (SEG_HIST)
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    length = _row_length(lengths_ptr, row, N)
    score_row = scores_ptr + row * stride_st
    start = seg * seg_len
    end = tl.minimum(start + seg_len, length)
    rows = tl.arange(0, ROWS)
    within = tl.arange(0, G)
    out = maxima_ptr + row * stride_mt + seg * (seg_len // G)
    live_groups = tl.cdiv(tl.maximum(end - start, 0), ROWS * G) * ROWS  # steps that hold entries of the row
    for r0 in range(live_groups, seg_len // G, ROWS):  # past the row's length (causal prefill rows): empty
        tl.store(out + r0 + rows, tl.zeros([ROWS], tl.int32))
    for r0 in range(0, live_groups, ROWS):
        first = tl.multiple_of(start + r0 * G, ROWS * G)
        cols = first + rows[:, None] * G + within[None, :]  # [ROWS, G]
        if first + ROWS * G <= end:  # a whole step: unmasked 16-byte loads
            x = tl.load(score_row + cols)
        else:
            x = tl.load(score_row + cols, mask=cols < end, other=float("-inf"))
        best = tl.max(x, axis=1)
        key = tl.where(best == float("-inf"), tl.zeros([ROWS], tl.uint32), _sort_key(best))
        tl.store(out + r0 + rows, key.to(tl.int32, bitcast=True))
    if SEG_HIST:  # the threshold's first digit: one histogram of the segment's maxima as stored (L2-hot)
        tl.debug_barrier()  # (stored by other threads of the program)
        hist = tl.zeros([256], tl.int32)
        for g0 in tl.static_range(0, GROUPS, HIST_CHUNK):  # (chunks: fewer registers than one histogram of 2048)
            groups = g0 + tl.arange(0, HIST_CHUNK)
            key = tl.load(out + groups, mask=groups < live_groups, other=0).to(tl.uint32, bitcast=True)
            hist += _digit_histogram(key, key != 0, 0)
        segment = row * tl.num_programs(1) + seg
        tl.store(hist_ptr + segment * 256 + tl.arange(0, 256), hist)


@triton.jit(do_not_specialize=SIZE_ARGS)
def group_compact_kernel(
    scores_ptr, stride_st, lengths_ptr, bound_ptr,
    maxima_ptr, live_ptr, stride_mt,  # [T, S * GROUPS] int32: group maxima; scratch for the live group list
    cand_idx_ptr, cand_key_ptr, stride_ct, counts_ptr,  # as in bound_compact_kernel
    hist_ptr,  # SEG_HIST: [T, S, 256] int32, the segment's survivors' bins relative to the bound (the finish's first)
    N, seg_len, segments,
    GROUPS: tl.constexpr, G: tl.constexpr, BATCH: tl.constexpr,  # GROUPS = seg_len / G; BATCH groups per step
    SEG_HIST: tl.constexpr, HIST_CHUNK: tl.constexpr,  # survivors a histogram step (SEG_HIST)
    PREFETCH: tl.constexpr,  # loads of the next batches issued before this batch's scan
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    length = _row_length(lengths_ptr, row, N)
    bound = tl.load(bound_ptr + row).to(tl.uint32, bitcast=True)
    score_row = scores_ptr + row * stride_st
    groups = tl.arange(0, GROUPS)
    maxima = tl.load(maxima_ptr + row * stride_mt + seg * GROUPS + groups).to(tl.uint32, bitcast=True)
    live = maxima >= bound  # empty groups have key 0 < bound
    live_row = live_ptr + row * stride_mt + seg * GROUPS
    tl.store(live_row + tl.cumsum(live.to(tl.int32), axis=0) - 1, seg * GROUPS + groups, mask=live)
    num_live = tl.sum(live.to(tl.int32), axis=0)
    tl.debug_barrier()  # the list is read back below by other threads of this program
    idx_out = cand_idx_ptr + row * stride_ct + seg * seg_len
    key_out = cand_key_ptr + row * stride_ct + seg * seg_len
    batch = tl.arange(0, BATCH)
    within = tl.arange(0, G)
    kept = 0
    if PREFETCH:
        # Each step's two dependent loads (its group ids, then their scores) are what a step waits on: here a step
        # gathers the next batch's scores (ids loaded a step earlier) and loads the ids of the batch after that
        # before it scans its own, so the loads overlap the scans. The same batches in the same order: the same bits.
        listed = batch < num_live
        group = tl.load(live_row + batch, mask=listed, other=0)
        cols = group[:, None] * G + within[None, :]
        x = tl.load(score_row + cols, mask=listed[:, None] & (cols < length), other=float("-inf"))
        listed_next = BATCH + batch < num_live
        group_next = tl.load(live_row + BATCH + batch, mask=listed_next, other=0)
        for b0 in range(0, num_live, BATCH):
            listed_after = b0 + 2 * BATCH + batch < num_live
            group_after = tl.load(live_row + b0 + 2 * BATCH + batch, mask=listed_after, other=0)
            cols_next = group_next[:, None] * G + within[None, :]
            x_next = tl.load(score_row + cols_next, mask=listed_next[:, None] & (cols_next < length),
                             other=float("-inf"))
            cols = group[:, None] * G + within[None, :]  # [BATCH, G], index order row-major
            inside = listed[:, None] & (cols < length)
            kept = _keep(tl.reshape(x, [BATCH * G]), tl.reshape(cols, [BATCH * G]),
                         tl.reshape(inside, [BATCH * G]), bound, idx_out, key_out, kept)
            x, group, listed = x_next, group_next, listed_next
            group_next, listed_next = group_after, listed_after
    else:
        for b0 in range(0, num_live, BATCH):
            listed = b0 + batch < num_live
            group = tl.load(live_row + b0 + batch, mask=listed, other=0)
            cols = group[:, None] * G + within[None, :]  # [BATCH, G], index order row-major
            inside = listed[:, None] & (cols < length)
            x = tl.load(score_row + cols, mask=inside, other=float("-inf"))
            kept = _keep(tl.reshape(x, [BATCH * G]), tl.reshape(cols, [BATCH * G]),
                         tl.reshape(inside, [BATCH * G]), bound, idx_out, key_out, kept)
    _segment_done(counts_ptr, hist_ptr, row, seg, segments, key_out, kept, bound, SEG_HIST, HIST_CHUNK)


def auto_group_size(width: int, k: int) -> int:
    """Entries per group: ``G k <= width / 4`` (about a quarter of the groups live on i.i.d. scores), 1 .. 16."""
    size = 1
    while size < 16 and 2 * size * k * 4 <= width:
        size *= 2
    return size


def maxima_layout(width: int, k: int, *, chunk=1024, steps=16, group_size=None, **_ignored) -> tuple[int, int]:
    """``(G, columns)``: the group size and the ``maxima [T, columns]`` width that :func:`topk_groups` launches with
    for rows of ``width`` scores (its own arguments; others ignored, so a whole :func:`.topk.topk` configuration may be
    passed): what a producer of the scores (the indexer, ``group_maxima``) fills so that the first pass is skipped.
    Group ``j`` of a row is entries ``j G .. j G + G - 1``; columns past ``ceil(width / G)`` belong to no entry and
    must hold 0 (no valid entry)."""
    size = auto_group_size(width, k) if group_size is None else group_size
    steps = min(steps, max(1, 2048 * size // chunk))
    seg_len = chunk * steps
    return size, triton.cdiv(max(width, 1), seg_len) * (seg_len // size)


def topk_groups(scores, lengths, k, out, emit, req_ids, block_table, block_tokens, *, chunk=1024, steps=16,
                group_size=None, batch=64, finish_chunk=512, num_warps=4, finish_warps=4, segment_histograms=False,
                compact_prefetch=False, scratch=None, stats=None, maxima=None):
    """Launch the four kernels for ``scores [T, N]`` into ``out [T, k]`` (arguments as :func:`.topk.topk`).

    Args:
        chunk: entries per step of the max pass (power of two, a multiple of the group size).
        steps: steps per segment (``seg_len = chunk * steps``, power of two).
        group_size: ``G`` (power of two; None: :func:`auto_group_size`). batch: live groups per step of
            the compaction (power of two). segment_histograms: the first pass and the compaction also store
            each segment's histogram of what they wrote, so the threshold kernel reads the maxima once, not twice,
            and the finish the survivors three times, not four (module docstring; the same result; segments of at
            most 2048 groups). compact_prefetch: the compaction issues the next batch's score gather and the
            group ids of the batch after it before scanning each batch (the same result).
            finish_chunk, finish_warps, scratch, stats: as :func:`.topk_bound.topk_bound`.
        maxima: the group maxima already made by whoever wrote the scores (the fused indexer -> top-k:
            :func:`.indexer_gluon.launch`'s ``maxima``): a contiguous ``[T, columns]`` int32 tensor of
            :func:`maxima_layout`, ``maxima[t, j]`` the order-preserving key (:func:`.topk_common._sort_key`) of the
            largest of entries ``j G .. j G + G - 1`` of row ``t`` below its length, 0 where there is none (and in
            the columns past the width). The first pass is then not launched and the threshold reads the maxima for
            its first digit too (``segment_histograms`` then shapes the compaction and finish only): the same bound,
            survivors and output, bit for bit.
    """
    scores = aligned_rows(scores)  # (LAUNCHER_ALIGNED_ARGS)
    tokens, width = scores.shape
    size = auto_group_size(width, k) if group_size is None else group_size
    if chunk % size or chunk & (chunk - 1) or steps & (steps - 1) or batch & (batch - 1):
        raise ValueError(f"dsahal.topk (triton groups): chunk {chunk}, steps {steps} and batch {batch} expected "
                         f"powers of two with chunk a multiple of the group size {size}")
    steps = min(steps, max(1, 2048 * size // chunk))  # at most 2048 groups per segment (one tensor of them)
    seg_len = chunk * steps
    segments = triton.cdiv(max(width, 1), seg_len)
    per_segment = seg_len // size
    device = scores.device
    given = maxima is not None
    if given:
        _check_maxima(maxima, tokens, segments * per_segment, size, device)
    else:
        maxima = torch.empty((tokens, segments * per_segment), dtype=torch.int32, device=device)
    live = torch.empty_like(maxima)
    bound = torch.empty((tokens,), dtype=torch.int32, device=device)
    counts = torch.empty((tokens, segments), dtype=torch.int32, device=device)
    # segment s's survivors fill at most columns s * seg_len .. N - 1 of the scratch rows
    cand_idx = _scratch(scratch, tokens, width, device)
    cand_key = torch.empty_like(cand_idx)
    grid = (tokens, segments)
    step = min(2048, per_segment)
    if segment_histograms and step != per_segment:
        raise ValueError(f"dsahal.topk (triton groups): segment_histograms expected at most 2048 groups a segment, "
                         f"got {per_segment} (chunk {chunk} / group size {size})")
    # (the threshold then reads the first pass's segments' histograms: its own segments must be those)
    hist, survivor_hist = segment_histogram_buffers(segment_histograms, tokens, segments, bound)
    if not given:
        group_max_kernel[grid](scores, scores.stride(0), lengths, maxima, maxima.stride(0), hist, width, seg_len,
                               ROWS=chunk // size, G=size, SEG_HIST=segment_histograms, GROUPS=per_segment,
                               HIST_CHUNK=min(per_segment, MAXIMA_HIST_CHUNK), num_warps=num_warps)
    # a threshold step of `step` group maxima covers step * size entries of the row (given maxima: no histograms of
    # them were made, so the threshold's first digit reads them too)
    bound_threshold_kernel[(tokens,)](maxima, bound, lengths, hist, width, k, step * size, maxima.shape[1] // step,
                                      CHUNK=step, LEVELS=BOUND_LEVELS, HIST0=segment_histograms and not given,
                                      num_warps=num_warps)
    group_compact_kernel[grid](scores, scores.stride(0), lengths, bound, maxima, live, maxima.stride(0), cand_idx,
                               cand_key, cand_idx.stride(0), counts, survivor_hist, width, seg_len, segments,
                               GROUPS=per_segment, G=size, BATCH=batch, SEG_HIST=segment_histograms,
                               HIST_CHUNK=SURVIVOR_HIST_CHUNK, PREFETCH=compact_prefetch, num_warps=num_warps)
    bound_finish_kernel[(tokens,)](cand_idx, cand_key, cand_idx.stride(0), counts, bound, out, out.stride(0), req_ids,
                                   block_table, block_table.stride(0), block_table.shape[1], block_tokens, k,
                                   seg_len, segments, survivor_hist, EMIT_SLOTS=emit, CHUNK=finish_chunk,
                                   SEG_HIST=segment_histograms, num_warps=finish_warps)
    if stats is not None:
        stats["survivors"] = counts.sum(dim=1, dtype=torch.int32)
    return out


def maxima_of(scores: torch.Tensor, lengths: torch.Tensor, size: int, columns: int) -> torch.Tensor:
    """The ``maxima`` that :func:`topk_groups` takes, in torch (the contract a scores' producer meets, as the tests and
    the H200 check build it): ``[T, columns]`` int32, column ``j`` the order-preserving key of the largest of scores
    ``j size .. j size + size - 1`` of ``scores [T, N]`` below the row's length (``lengths [T]``; -0.0 as +0.0; NaN
    only where all are), 0 for a group with none above -inf and for the columns past the width."""
    tokens, width = scores.shape
    x = scores.masked_fill(torch.arange(width, device=scores.device)[None, :] >= lengths.long()[:, None],
                           float("-inf"))
    x = torch.nn.functional.pad(x, (0, columns * size - width), value=float("-inf")).view(tokens, columns, size)
    nan = x.isnan()
    best = x.masked_fill(nan, float("-inf")).amax(dim=2)
    best = torch.where(nan.all(dim=2), torch.full_like(best, float("nan")), best)
    best = torch.where(best == 0, torch.zeros_like(best), best)
    bits = best.view(torch.int32)
    keys = bits ^ ((bits >> 31) | torch.tensor(-(1 << 31), dtype=torch.int32, device=bits.device))
    return torch.where(best == float("-inf"), torch.zeros_like(keys), keys).contiguous()


def check_producer_maxima(name: str, argument: str, maxima, size, tokens: int, width: int, device) -> None:
    """A scores' producer's ``maxima`` argument (the fused indexer -> top-k; the one check of
    :func:`.indexer.indexer_score`'s ``group_maxima`` and :func:`.indexer_gluon.launch`'s ``maxima``): ``size`` one of
    :data:`MAXIMA_GROUPS`, ``maxima`` an int32 ``[tokens, >= cdiv(width, size)]`` tensor with unit last stride on
    ``device``. Raises ValueError naming ``name`` and ``argument``."""
    if size not in MAXIMA_GROUPS:
        raise ValueError(f"{name}: maxima_group expected one of {MAXIMA_GROUPS}, got {size!r}")
    columns = triton.cdiv(width, size)
    if (not isinstance(maxima, torch.Tensor) or maxima.dtype != torch.int32 or maxima.dim() != 2
            or maxima.shape[0] != tokens or maxima.shape[1] < columns or maxima.stride(1) != 1
            or maxima.device != device):
        got = (f"{maxima.dtype} {list(maxima.shape)} strides {maxima.stride()} on {maxima.device}"
               if isinstance(maxima, torch.Tensor) else type(maxima).__name__)
        raise ValueError(f"{name}: {argument} expected an int32 [{tokens}, >= {columns}] tensor with unit last stride "
                         f"on {device}, got {got}")


def _check_maxima(maxima, tokens: int, columns: int, size: int, device) -> None:
    if (not isinstance(maxima, torch.Tensor) or maxima.dtype != torch.int32 or tuple(maxima.shape) != (tokens, columns)
            or not maxima.is_contiguous() or maxima.device != device):
        got = (f"{maxima.dtype} {list(maxima.shape)} on {maxima.device}, contiguous {maxima.is_contiguous()}"
               if isinstance(maxima, torch.Tensor) else type(maxima).__name__)
        raise ValueError(f"dsahal.topk (triton groups): argument 'maxima' expected a contiguous int32 [{tokens}, "
                         f"{columns}] tensor on {device} (groups of {size}: maxima_layout), got {got}")


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
