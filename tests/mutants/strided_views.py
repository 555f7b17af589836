"""Helpers of the ``teeth_*`` mutants: what a kernel sees when it ignores a tensor's real layout.

A kernel receives a data pointer and (if it asks) strides. These build the tensor such a kernel
effectively reads: same data pointer, the strides it assumed. Every view stays inside the storage
of the tensor it reinterprets (each is at most as long as the real one's span).
"""
from __future__ import annotations

import torch


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def as_if_contiguous(t: torch.Tensor) -> torch.Tensor:
    """``t``'s data pointer read with row-major strides (a kernel that takes only the pointer)."""
    return t.as_strided(t.shape, contiguous_strides(t.shape), t.storage_offset())


def pages_as_flat_slots(pages: torch.Tensor) -> torch.Tensor:
    """Pages addressed by slot ``s`` at ``s * stride(1)``: blocks assumed back to back, i.e.
    ``stride(0) = block_tokens * stride(1)``. Right for a page tensor of its own (and for padded
    records), wrong for the packed cache, where ``stride(0)`` is the row of every layer's pages."""
    blocks, block_tokens, _ = pages.shape
    return pages.as_strided(pages.shape, (block_tokens * pages.stride(1), pages.stride(1), pages.stride(2)),
                            pages.storage_offset())


def int64_read_as_int32(index: torch.Tensor) -> torch.Tensor:
    """An int64 index tensor read as if it held int32 words (low and high halves interleaved);
    int32 tensors pass through."""
    if index.dtype != torch.int64:
        return index
    words = index.contiguous().view(torch.int32).reshape(-1)[: index.numel()]
    return words.reshape(index.shape)
