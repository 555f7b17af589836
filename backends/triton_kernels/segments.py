"""A token batch's segment plan for the indexer kernels, in one launch.

The indexer kernels score a segment (up to ``GROUP`` consecutive tokens of one request) per program, so
every launch needs, per token, its index within its run of equal consecutive request ids (the run
offset) and the list of segment first tokens (run offset a multiple of ``GROUP``), live segments first,
then ``T`` for the programs that exit at once. Written as torch ops that took 15 launches (arange,
compare, cummax, cumsum, scatter, ...): on the H200 about 45 µs of GPU time per indexer call at 64 x 1
tokens (Nsight Compute: the scoring kernel 339 µs, the op 384 µs), more than 10% of the call, and some
150 µs of host time. Here one program walks the batch in blocks of ``BLOCK`` tokens, carrying the current
run's first token and the segment count between blocks (a decode batch is one block). No host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from dsahal.kernel_launch import wrap_launched

# Tokens per step of the walk: SMALL_BLOCK for batches that fit it (decode steps), else PLAN_BLOCK (a 32K-token
# prefill takes 32 steps). Two fixed sizes, so two compiles serve every batch size, both made by the warm-up's
# decode and prefill (a block sized to the batch would compile again at each new power of two of T,
# mid-serving); the small one also keeps the Triton interpreter's scans short (~0.1 ms per element there).
SMALL_BLOCK = 128
PLAN_BLOCK = 1024


@triton.jit
def _max(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=("T",))
def _plan_kernel(req_ptr, off_ptr, starts_ptr, T, GROUP: tl.constexpr, FROM_REQ: tl.constexpr,
                 WRITE_STARTS: tl.constexpr, BLOCK: tl.constexpr):
    """FROM_REQ: read request ids ``[T]`` and write run offsets ``[T]`` (else read the run offsets);
    WRITE_STARTS: write the segment starts ``[T]``."""
    run_start = 0  # first token of the run the previous block ended in
    count = 0  # segments found so far
    for base in range(0, T, BLOCK):
        t = base + tl.arange(0, BLOCK)
        live = t < T
        if FROM_REQ:
            req = tl.load(req_ptr + t, mask=live, other=0)
            prev = tl.load(req_ptr + t - 1, mask=live & (t > 0), other=0)
            first = live & ((t == 0) | (req != prev))
            starts = tl.associative_scan(tl.where(first, t, run_start), 0, _max)
            off = t - starts
            tl.store(off_ptr + t, off, mask=live)
            run_start = tl.max(tl.where(live, starts, 0), 0)
        else:
            off = tl.load(off_ptr + t, mask=live, other=1)
        if WRITE_STARTS:
            seg = live & (off % GROUP == 0)
            slot = count + tl.cumsum(seg.to(tl.int32), 0) - 1
            tl.store(starts_ptr + slot, t, mask=seg)
            count += tl.sum(seg.to(tl.int32), 0)
    if WRITE_STARTS:
        for base in range(0, T, BLOCK):
            t = base + tl.arange(0, BLOCK)
            tl.store(starts_ptr + t, tl.zeros_like(t) + T, mask=(t >= count) & (t < T))


def _run(req_ids, offsets, group, from_req, write_starts):
    tokens = offsets.shape[0]
    starts = torch.empty(tokens, dtype=torch.int32, device=offsets.device) if write_starts else offsets
    if tokens:
        _plan_kernel[(1,)](req_ids, offsets, starts, tokens, GROUP=group, FROM_REQ=from_req,
                           WRITE_STARTS=write_starts, BLOCK=SMALL_BLOCK if tokens <= SMALL_BLOCK else PLAN_BLOCK,
                           num_warps=4)
    return starts


def segment_plan(req_ids: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """req_ids ``[T]`` int32 -> (run offsets ``[T]`` int32, segment starts ``[T]`` int32), one launch."""
    offsets = torch.empty(req_ids.shape[0], dtype=torch.int32, device=req_ids.device)
    return offsets, _run(req_ids, offsets, group, True, True)


def run_offsets(req_ids: torch.Tensor) -> torch.Tensor:
    """req_ids ``[T]`` int32 -> ``[T]`` int32: each token's index within its run of equal consecutive ids."""
    offsets = torch.empty(req_ids.shape[0], dtype=torch.int32, device=req_ids.device)
    _run(req_ids, offsets, 1, True, False)
    return offsets


def segment_starts(offsets: torch.Tensor, group: int) -> torch.Tensor:
    """Run offsets ``[T]`` int32 -> ``[T]`` int32: the tokens with ``offset % group == 0`` in order, then
    ``T``."""
    return _run(offsets, offsets, group, False, True)


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
