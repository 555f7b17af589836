"""The layout every route may rely on for integer metadata: unit stride in the last dim.

Kernels read slots, request ids, positions, lengths, state ids, ``cu_seqlens`` and block tables with a row
stride at most, their last dim as contiguous (the shared Triton kernels do, as paged-attention kernels
generally do). A strided view of one (``ids[::2]``, a column of a wider buffer) would have them read other
values, and ``cache_write``'s kernel write other rows of the cache (found on the ``nvidia`` backend under the
Triton interpreter: slots ``s[::2]`` wrote rows 0, 3, 5, 9 for 5, 9, 17, 30). So the public ops hand every
route these arguments with unit stride in the last dim: the tensor itself when it already has it (no copy,
no launch), else a contiguous copy. The validators accept any strides, as the reference does.
"""
from __future__ import annotations

import torch


def unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride in its last dim (``t`` itself when it has it or holds at most one element)."""
    if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] <= 1:
        return t
    return t.contiguous()
