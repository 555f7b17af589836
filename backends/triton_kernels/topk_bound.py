"""Exact top-k from a lower bound on the k-th largest score: two cheap passes over each row.

The radix kernels (:mod:`.topk`, :mod:`.topk_split`) spend most of their time binning every entry
of the row into 256-bin histograms (ALU-bound), twice, and real indexer scores crowd a few
exponents, so even two 8-bit digits leave long candidate lists. This module bins only a small
fraction of the row. Rows are split over ``T x S`` programs (one per row and segment of
``seg_len = CHUNK * group`` entries); four launches, no atomics:

1. ``bound_max_kernel`` (``T x S``): each lane keeps the running max of the ``group`` entries it sees
   in its segment -> ``maxima[T, S * CHUNK]`` (order-preserving keys, 0 for a lane with no valid
   entry). One float max per entry: the pass runs at the speed of the read.
2. ``bound_threshold_kernel`` (``T``): ``L`` = the top 16 bits of the k-th largest lane maximum
   (two 256-bin histograms over the maxima of the segments the row reaches, ``1/group`` of its
   entries; none for a row of fewer than k entries), low bits zero. The
   k largest maxima are k distinct entries ``>= L``, so the row's k-th largest key ``τ >= L``.
   Fewer than k non-empty lanes: ``L = 1`` (below every valid key: everything survives).
3. ``bound_compact_kernel`` (``T x S``): every valid entry with key ``>= L`` (a superset of the
   answer) is appended, in index order, to its segment's own region of the scratch rows (index and
   key), and the segment's count is stored. For i.i.d. scores with ``group * k <= N / 4`` about
   ``1.15 k`` entries survive (the bound is tight whatever the exponents look like).
4. ``bound_finish_kernel`` (``T``): one histogram of the survivors' top 16 bits as steps above ``L``'s
   (255 bins and an open-ended one; a weak bound falls back to two 8-bit digits), then two 8-bit digit
   histograms pin ``τ`` exactly,
   then the survivors above ``τ`` and the first ones equal to ``τ`` in index order are written
   (the tie rule: equal scores go to the smaller index), then -1 padding. ``<= k`` survivors: all win.

With ``segment_histograms`` the two per-row kernels each read their inputs once fewer: the first pass stores
each segment's 256-bin histogram of its lane maxima's top 8 key bits (the threshold sums them for its first
digit), and the compaction each segment's histogram of its survivors' top 16 key bits relative to ``L`` (the finish
sums them for its first pass). The same ``L`` and ``τ``, bit for bit; the histograms' work moves to the ``T x S``
passes, whose time is their reads.

Output order: index order. The result does not depend on ``CHUNK``/``group``/other rows (bitwise the
same set and order), and nothing waits on the host (CUDA-graph safe). Adversarial rows (all equal,
or most entries tied at ``L``) let everything survive: still exact, as slow as one program per row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .alignment import aligned_rows
from .topk_common import _digit_histogram, _emit, _matches, _pad, _sort_key, _threshold
from dsahal.kernel_launch import wrap_launched

SIZE_ARGS = ("max_blocks", "block_tokens", "N", "k", "seg_len", "segments")
BOUND_LEVELS = 2  # 8-bit digits of the k-th largest lane maximum kept in L (16 bits: 1/128 octave)
SURVIVOR_HIST_CHUNK = 512  # segment_histograms: survivors a step of the compaction's histogram (64 registers on sm_90)
# The arguments whose alignment facts compile_budget's batch-invariant mode keeps: the scores (:func:`topk_bound` and
# .topk_groups align them: .alignment.aligned_rows) and the buffers the launchers allocate (LAUNCHER_ALIGNED_ARGS,
# checked); the output's row stride, k (CACHE_ARGS: the same whichever rows a batch holds). Without them the sm_90
# compiles of the lane-maxima and compaction passes read the scores 4 bytes a load, and the groups method's first pass
# ran 193 instructions a step against the default compile's 96 (thirty-first session, ``python -m
# dsahal.backends.nvidia.aot --invariant``); with them every pass compiles to the default's SASS.
CACHE_ARGS = {"bound_finish_kernel": ("stride_ot",)}
LAUNCHER_ALIGNED_ARGS = {"bound_max_kernel": ("scores_ptr", "stride_st", "maxima_ptr", "hist_ptr"),
                         "bound_threshold_kernel": ("maxima_ptr", "hist_ptr"),
                         "bound_compact_kernel": ("scores_ptr", "stride_st", "hist_ptr"),
                         "bound_finish_kernel": ("out_ptr",)}


@triton.jit
def _row_length(lengths_ptr, row, N):
    return tl.maximum(tl.minimum(tl.load(lengths_ptr + row).to(tl.int32), N), 0)


@triton.jit(do_not_specialize=SIZE_ARGS)
def bound_max_kernel(
    scores_ptr, stride_st, lengths_ptr,  # scores [T, N] fp32, lengths [T]
    maxima_ptr,  # [T, S * CHUNK] int32: per-lane max key (0: no valid entry)
    hist_ptr,  # SEG_HIST: [T, S, 256] int32, the segment's histogram of its non-empty lane maxima's top 8 key bits
    N, seg_len, segments,
    CHUNK: tl.constexpr, SEG_HIST: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    length = _row_length(lengths_ptr, row, N)
    score_row = scores_ptr + row * stride_st
    lanes = tl.arange(0, CHUNK)
    start = seg * seg_len
    end = tl.minimum(start + seg_len, length)
    best = tl.full([CHUNK], float("-inf"), tl.float32)
    full = tl.maximum(end - start, 0) // CHUNK
    for i in range(full):  # whole chunks: unmasked, aligned (seg_len is whole chunks), so 16-byte loads
        c0 = tl.multiple_of(start + i * CHUNK, CHUNK)
        best = tl.maximum(best, tl.load(score_row + c0 + lanes))
    cols = start + full * CHUNK + lanes
    if start + full * CHUNK < end:  # the row's last, partial chunk
        best = tl.maximum(best, tl.load(score_row + cols, mask=cols < end, other=float("-inf")))
    # -inf (masked or absent) must not count as a lane maximum: key 0 sorts below every valid key
    key = tl.where(best == float("-inf"), tl.zeros([CHUNK], tl.uint32), _sort_key(best))
    tl.store(maxima_ptr + (row * segments + seg) * CHUNK + lanes, key.to(tl.int32, bitcast=True))
    if SEG_HIST:  # the threshold's first digit (the lane maxima are in registers: no reload)
        tl.store(hist_ptr + (row * segments + seg) * 256 + tl.arange(0, 256), _digit_histogram(key, key != 0, 0))


@triton.jit(do_not_specialize=SIZE_ARGS)
def bound_threshold_kernel(
    maxima_ptr, bound_ptr,  # maxima [T, S * CHUNK] int32 keys; bound [T] int32 (key bits of L)
    lengths_ptr,  # [T]
    hist_ptr,  # HIST0: [T, S, 256] int32, each segment's histogram of its non-empty maxima's first digit
    N, k, seg_len, segments,
    CHUNK: tl.constexpr, LEVELS: tl.constexpr, HIST0: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = maxima_ptr + row * segments * CHUNK
    lanes = tl.arange(0, CHUNK)
    # Only the segments the row reaches hold non-empty lanes (bound_max_kernel leaves the others all 0,
    # which no histogram counts): a causal prefill's rows reach half the segments on average. A row of
    # fewer than k entries cannot have k non-empty lanes: no histogram at all.
    length = _row_length(lengths_ptr, row, N)
    live = tl.where(length >= k, (length + seg_len - 1) // seg_len, 0)
    prefix = tl.full([], 0, tl.uint32)
    need = k
    nonempty = 0
    for level in tl.static_range(LEVELS):
        hist = tl.zeros([256], tl.int32)
        if HIST0 and level == 0:  # the first pass's histograms of the same maxima: the same counts
            for s in range(live):
                hist += tl.load(hist_ptr + (row * segments + s) * 256 + tl.arange(0, 256))
        else:
            for c0 in range(0, live * CHUNK, CHUNK):
                key = tl.load(base + c0 + lanes).to(tl.uint32, bitcast=True)
                hist += _digit_histogram(key, (key != 0) & _matches(key, prefix, level), level)
        if level == 0:
            nonempty = tl.sum(hist, axis=0)
        chosen, above = _threshold(hist, need)
        prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * level))
        need = need - above
    # fewer than k non-empty lanes: no k-th maximum, no bound (1 is below every valid key)
    bound = tl.where(nonempty >= k, prefix, tl.full([], 1, tl.uint32))
    tl.store(bound_ptr + row, bound.to(tl.int32, bitcast=True))


@triton.jit(do_not_specialize=SIZE_ARGS)
def bound_compact_kernel(
    scores_ptr, stride_st, lengths_ptr, bound_ptr,
    cand_idx_ptr, cand_key_ptr, stride_ct,  # [T, N] int32 each: survivors of segment s from column s * seg_len
    counts_ptr,  # [T, S] int32 survivors per segment
    hist_ptr,  # SEG_HIST: [T, S, 256] int32, the segment's survivors' bins relative to the bound (_relative_bins)
    N, seg_len, segments,
    CHUNK: tl.constexpr, SEG_HIST: tl.constexpr, HIST_CHUNK: tl.constexpr,  # survivors a histogram step (SEG_HIST)
):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    length = _row_length(lengths_ptr, row, N)
    bound = tl.load(bound_ptr + row).to(tl.uint32, bitcast=True)
    score_row = scores_ptr + row * stride_st
    lanes = tl.arange(0, CHUNK)
    start = seg * seg_len
    end = tl.minimum(start + seg_len, length)
    idx_out = cand_idx_ptr + row * stride_ct + start
    key_out = cand_key_ptr + row * stride_ct + start
    kept = 0
    full = tl.maximum(end - start, 0) // CHUNK
    for i in range(full):  # whole chunks: unmasked 16-byte loads (as in bound_max_kernel)
        c0 = tl.multiple_of(start + i * CHUNK, CHUNK)
        x = tl.load(score_row + c0 + lanes)
        kept = _keep(x, c0 + lanes, lanes == lanes, bound, idx_out, key_out, kept)
    cols = start + full * CHUNK + lanes
    if start + full * CHUNK < end:
        x = tl.load(score_row + cols, mask=cols < end, other=float("-inf"))
        kept = _keep(x, cols, cols < end, bound, idx_out, key_out, kept)
    _segment_done(counts_ptr, hist_ptr, row, seg, segments, key_out, kept, bound, SEG_HIST, HIST_CHUNK)


@triton.jit
def _keep(x, cols, inside, bound, idx_out, key_out, kept):
    """Append the columns of valid entries with key ``>= bound`` (index order) after the ``kept`` ones."""
    key = _sort_key(x)
    keep = inside & (x != float("-inf")) & (key >= bound)
    where = kept + tl.cumsum(keep.to(tl.int32), axis=0) - 1
    tl.store(idx_out + where, cols, mask=keep)
    tl.store(key_out + where, key.to(tl.int32, bitcast=True), mask=keep)
    return kept + tl.sum(keep.to(tl.int32), axis=0)


@triton.jit
def _survivor_histogram(idx_row, key_row, counts_row, segments, seg_len, prefix, lanes, LEVEL: tl.constexpr):
    """256-bin histogram of digit ``LEVEL`` over the survivors whose top ``LEVEL`` digits equal ``prefix``."""
    CHUNK: tl.constexpr = lanes.shape[0]
    hist = tl.zeros([256], tl.int32)
    for s in range(segments):
        kept = tl.load(counts_row + s)
        for c0 in range(0, kept, CHUNK):
            slot = c0 + lanes
            inside = slot < kept
            key = tl.load(key_row + s * seg_len + slot, mask=inside, other=0).to(tl.uint32, bitcast=True)
            hist += _digit_histogram(key, inside & _matches(key, prefix, LEVEL), LEVEL)
    return hist


@triton.jit
def _relative_bins(key_list, kept, base, lanes):
    """256-bin histogram of ``min(top 16 key bits - base, 255)`` over the first ``kept`` keys of ``key_list``
    (one segment's survivors: all have top bits >= base)."""
    CHUNK: tl.constexpr = lanes.shape[0]
    hist = tl.zeros([256], tl.int32)
    for c0 in range(0, kept, CHUNK):
        slot = c0 + lanes
        inside = slot < kept
        key = tl.load(key_list + slot, mask=inside, other=0).to(tl.uint32, bitcast=True)
        digit = tl.where(inside, tl.minimum((key >> 16) - base, 255), 0).to(tl.int32)
        # lanes past the list were put in bin 0: take them out again
        hist += tl.histogram(digit, 256) - tl.where(tl.arange(0, 256) == 0, tl.sum((~inside).to(tl.int32), axis=0), 0)
    return hist


@triton.jit
def _segment_done(counts_ptr, hist_ptr, row, seg, segments, key_out, kept, bound, SEG_HIST: tl.constexpr,
                  HIST_CHUNK: tl.constexpr):
    """A compaction program's end (both methods): its survivor count, and with ``SEG_HIST`` the finish's first
    histogram over the survivors as stored (L2-hot), in T x S programs; none without a bound (L = 1: every valid
    entry survived, and the finish goes straight to its two-digit passes)."""
    tl.store(counts_ptr + row * segments + seg, kept)
    if SEG_HIST and bound != 1:
        tl.debug_barrier()  # (stored by other threads of the program)
        hist = _relative_bins(key_out, kept, bound >> 16, tl.arange(0, HIST_CHUNK))
        tl.store(hist_ptr + (row * segments + seg) * 256 + tl.arange(0, 256), hist)


@triton.jit
def _relative_histogram(key_row, counts_row, segments, seg_len, base, lanes, hist_row, SEG_HIST: tl.constexpr):
    """:func:`_relative_bins` over all survivors of a row; with ``SEG_HIST`` the sum of the segments' own
    (``hist_row [S, 256]``, stored by the compaction pass) instead of reading the survivors."""
    hist = tl.zeros([256], tl.int32)
    for s in range(segments):
        if SEG_HIST:
            hist += tl.load(hist_row + s * 256 + tl.arange(0, 256))
        else:
            hist += _relative_bins(key_row + s * seg_len, tl.load(counts_row + s), base, lanes)
    return hist


@triton.jit(do_not_specialize=SIZE_ARGS)
def bound_finish_kernel(
    cand_idx_ptr, cand_key_ptr, stride_ct, counts_ptr, bound_ptr,
    out_ptr, stride_ot,  # [T, k] int32
    req_ptr, block_table_ptr, stride_bt, max_blocks, block_tokens,  # used when EMIT_SLOTS
    k, seg_len, segments,
    hist_ptr,  # SEG_HIST: [T, S, 256] int32, each segment's survivors' relative bins (:func:`_relative_bins`)
    EMIT_SLOTS: tl.constexpr, CHUNK: tl.constexpr, SEG_HIST: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    idx_row = cand_idx_ptr + row * stride_ct
    key_row = cand_key_ptr + row * stride_ct
    counts_row = counts_ptr + row * segments
    out_row = out_ptr + row * stride_ot
    lanes = tl.arange(0, CHUNK)
    req = 0
    if EMIT_SLOTS:
        req = tl.load(req_ptr + row).to(tl.int32)
    survivors = 0
    for s in range(segments):
        survivors += tl.load(counts_row + s)
    # tau = the exact k-th largest survivor key; with <= k survivors tau = 0 and every survivor
    # (valid keys are >= 0x00800000) is above it.
    prefix = tl.full([], 0, tl.uint32)
    need = 0
    if survivors > k:
        # The top 16 bits of tau in one pass: survivors sit at or just above L (about 100 steps of the
        # top 16 bits on indexer scores), so bins of "steps above L", the last one open-ended, pin them.
        bound = tl.load(bound_ptr + row).to(tl.uint32, bitcast=True)
        base = bound >> 16
        chosen = tl.full([], 255, tl.int32)
        if bound != 1:  # L = 1 (no bound: every valid entry survived) puts every key 128+ steps up: skip the pass
            hist = _relative_histogram(key_row, counts_row, segments, seg_len, base, lanes,
                                       hist_ptr + row * segments * 256, SEG_HIST)
            chosen, above = _threshold(hist, k)
            prefix = (base + chosen.to(tl.uint32)) << 16
            need = k - above
        if chosen == 255:  # tau is 255 or more steps above L (a weak bound, e.g. L = 1): two digits instead
            prefix = tl.full([], 0, tl.uint32)
            need = k
            for level in tl.static_range(2):
                hist = _survivor_histogram(idx_row, key_row, counts_row, segments, seg_len, prefix, lanes, level)
                chosen, above = _threshold(hist, need)
                prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * level))
                need = need - above
        for level in tl.static_range(2, 4):
            hist = _survivor_histogram(idx_row, key_row, counts_row, segments, seg_len, prefix, lanes, level)
            chosen, above = _threshold(hist, need)
            prefix = prefix | (chosen.to(tl.uint32) << (24 - 8 * level))
            need = need - above
    written = 0
    ties_seen = 0
    for s in range(segments):
        kept = tl.load(counts_row + s)
        for c0 in range(0, kept, CHUNK):
            slot = c0 + lanes
            inside = slot < kept
            key = tl.load(key_row + s * seg_len + slot, mask=inside, other=0).to(tl.uint32, bitcast=True)
            col = tl.load(idx_row + s * seg_len + slot, mask=inside, other=0)
            tie = inside & (key == prefix)
            tie_rank = ties_seen + tl.cumsum(tie.to(tl.int32), axis=0)
            win = (inside & (key > prefix)) | (tie & (tie_rank <= need))
            win_i = win.to(tl.int32)
            _emit(out_row, written + tl.cumsum(win_i, axis=0) - 1, col, win, req, block_table_ptr, stride_bt,
                  max_blocks, block_tokens, EMIT_SLOTS)
            written += tl.sum(win_i, axis=0)
            ties_seen += tl.sum(tie.to(tl.int32), axis=0)
    _pad(out_row, written, k, lanes)


def segment_histogram_buffers(on: bool, tokens: int, segments: int, placeholder: torch.Tensor):
    """``segment_histograms``' two ``[T, S, 256]`` int32 buffers (the first pass's of its maxima, the compaction's
    of its survivors), or ``placeholder`` twice when off (the kernels then never touch them)."""
    if not on:
        return placeholder, placeholder
    maxima_hist = torch.empty((tokens, segments, 256), dtype=torch.int32, device=placeholder.device)
    return maxima_hist, torch.empty_like(maxima_hist)


def _scratch(scratch, tokens: int, width: int, device) -> torch.Tensor:
    """The survivors' index rows: ``scratch`` when given (a contiguous ``[T, >= N]`` int32 tensor), else new."""
    if scratch is None:
        return torch.empty((tokens, max(width, 1)), dtype=torch.int32, device=device)
    if (scratch.dtype != torch.int32 or scratch.dim() != 2 or scratch.shape[0] != tokens or scratch.shape[1] < width
            or not scratch.is_contiguous()):
        raise ValueError(f"dsahal.topk (triton bound): argument 'scratch' expected a contiguous [{tokens}, >= {width}] "
                         f"int32 tensor, got {tuple(scratch.shape)} {scratch.dtype}"
                         f"{'' if scratch.is_contiguous() else ' (not contiguous)'}")
    return scratch


def auto_group(width: int, k: int, chunk: int) -> int:
    """Entries per lane and segment: ``group * k <= width / 4`` keeps the bound tight (about 1.15 k
    survivors on i.i.d. scores), capped at 16 (more segments keep more SMs busy on few rows)."""
    group = 1
    while group < 16 and 2 * group * k * 4 <= width:
        group *= 2
    return group


def topk_bound(scores, lengths, k, out, emit, req_ids, block_table, block_tokens, *, chunk=1024, group=None,
               finish_chunk=512, num_warps=4, finish_warps=4, segment_histograms=False, scratch=None, stats=None):
    """Launch the four kernels for ``scores [T, N]`` into ``out [T, k]`` (arguments as :func:`.topk.topk`).

    Args:
        chunk: entries per step of the row passes (power of two). group: entries per lane and
            segment (``seg_len = chunk * group``; None: :func:`auto_group`). finish_chunk: survivors
            per step of the last kernel (power of two). segment_histograms: the first pass and the
            compaction also store each segment's histogram of what they wrote, so the threshold kernel reads the
            lane maxima once, not twice, and the finish the survivors three times, not four (module docstring;
            the same result). scratch: optional ``[T, N]`` int32 buffer for
            the survivors' indices (their keys get a second one). stats: optional dict that gets
            ``"survivors"`` (``[T]`` int32: entries at or above each row's bound; no host sync).
    """
    scores = aligned_rows(scores)  # (LAUNCHER_ALIGNED_ARGS)
    tokens, width = scores.shape
    group = auto_group(width, k, chunk) if group is None else group
    seg_len = chunk * group
    segments = triton.cdiv(max(width, 1), seg_len)
    device = scores.device
    maxima = torch.empty((tokens, segments * chunk), dtype=torch.int32, device=device)
    bound = torch.empty((tokens,), dtype=torch.int32, device=device)
    counts = torch.empty((tokens, segments), dtype=torch.int32, device=device)
    cand_idx = _scratch(scratch, tokens, width, device)
    cand_key = torch.empty_like(cand_idx)
    grid = (tokens, segments)
    maxima_hist, survivor_hist = segment_histogram_buffers(segment_histograms, tokens, segments, bound)
    bound_max_kernel[grid](scores, scores.stride(0), lengths, maxima, maxima_hist, width, seg_len, segments,
                           CHUNK=chunk, SEG_HIST=segment_histograms, num_warps=num_warps)
    bound_threshold_kernel[(tokens,)](maxima, bound, lengths, maxima_hist, width, k, seg_len, segments, CHUNK=chunk,
                                      LEVELS=BOUND_LEVELS, HIST0=segment_histograms, num_warps=num_warps)
    bound_compact_kernel[grid](scores, scores.stride(0), lengths, bound, cand_idx, cand_key, cand_idx.stride(0),
                               counts, survivor_hist, width, seg_len, segments, CHUNK=chunk,
                               SEG_HIST=segment_histograms, HIST_CHUNK=SURVIVOR_HIST_CHUNK, num_warps=num_warps)
    bound_finish_kernel[(tokens,)](cand_idx, cand_key, cand_idx.stride(0), counts, bound, out, out.stride(0), req_ids,
                                   block_table, block_table.stride(0), block_table.shape[1], block_tokens, k,
                                   seg_len, segments, survivor_hist, EMIT_SLOTS=emit, CHUNK=finish_chunk,
                                   SEG_HIST=segment_histograms, num_warps=finish_warps)
    if stats is not None:
        stats["survivors"] = counts.sum(dim=1, dtype=torch.int32)
    return out


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
