"""What the kernels' launchers guarantee about the alignment of the batch's own tensors.

Triton compiles what it knows of a tensor's alignment (a 16-byte aligned start, strides that are multiples of 16
elements) into how it lays the tensor out for loads and MMAs. Queries sliced out of a fused projection can start
anywhere, and a head count of 4 gives weights rows of 4 floats; a launcher that copies such tensors
(:func:`aligned_rows`) gives its kernel the same facts on every call:

- default mode: the fast compile, whatever the caller's queries (unaligned ones cost the general sparse-MLA kernel's
  sm_90 main loop 1.54x the instructions at H = 128, fp8_ds_mla, and the block-tile indexer's 1.65x with bf16
  queries, spilling 400 bytes; thirty-first session, ``python -m dsahal.backends.nvidia.aot --invariant``);
- batch-invariant mode: the facts do not depend on where a batch's queries start, so the kernel's compile keeps them
  (:mod:`.compile_budget`, ``LAUNCHER_ALIGNED_ARGS``) and its loop is the default compile's.
"""
from __future__ import annotations

import torch


def aligned_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., D]`` itself when its start is 16-byte aligned, its last dim unit-stride and its other strides multiples
    of 16 elements; else a copy with those facts (rows padded to a multiple of 16 elements, the view of their first
    D: the same values). Queries ``[T, H, 576]`` or ``[T, H, 128]`` copy contiguous; weights ``[T, H]`` of 4 heads
    copy into rows of 16."""
    if x.dim() == 0:
        return x
    *outer, last = x.stride()  # (one call each: this runs on every launch, ~0.6 us on a CPU host)
    if last == 1 and not x.data_ptr() % 16:
        for stride in outer:
            if stride % 16:
                break
        else:
            return x
    width = -(-x.shape[-1] // 16) * 16
    rows = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)[..., :x.shape[-1]]
    rows.copy_(x)
    return rows
