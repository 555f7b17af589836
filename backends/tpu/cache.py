"""Cache write and read on XLA: quantise, then scatter into the paged pool by slot."""
from __future__ import annotations

import torch

from .formats import pack, unpack
from .paged import gather_records, scatter_rows_skipping, split_slots


def cache_write(values, slots, pages, kind, fmt, scale) -> None:
    """Quantise ``values`` ``[N, dim]`` and write record ``i`` to slot ``slots[i]`` of ``pages``
    ``[num_blocks, block_tokens, token_bytes]`` uint8 (in place; -1 skips the token).

    Every token is packed (a static shape); the scatter skips the -1 ones without writing."""
    if values.shape[0] == 0:
        return
    keep = slots >= 0
    block, offset = split_slots(torch.where(keep, slots, torch.zeros_like(slots)), pages.shape[1])
    scatter_rows_skipping(pages, (block, offset), values, keep, encode=lambda rows: pack(rows, kind, fmt, scale))


def read_tokens(pages, slots, kind, fmt, scale=None):
    """Dequantised tokens at ``slots`` ``[*S]`` (-1 allowed) -> (``[*S, dim]`` fp32, valid ``[*S]``).

    Invalid slots read slot 0 and must be masked by the caller (``valid``)."""
    records, valid = gather_records(pages, slots)
    values = unpack(records, kind, fmt, scale)
    return values, valid

