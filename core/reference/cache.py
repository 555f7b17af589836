"""Reference cache write and read: pack with the format, scatter or gather by slot."""
from __future__ import annotations

import torch

from ..formats import cache_format


def split_slots(slots: torch.Tensor, block_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Physical slot -> (block, offset in block)."""
    slots = slots.long()
    return torch.div(slots, block_tokens, rounding_mode="floor"), slots % block_tokens


def cache_write(values, slots, pages, kind, fmt, scale) -> None:
    """Pack every token, then write the packed records of slots >= 0 through the page view."""
    keep = slots >= 0
    if not bool(keep.any()):
        return
    try:
        records = cache_format(kind, fmt).pack(values[keep], scale)
    except ValueError as exc:  # NaN/Inf in a written token: the format names itself, the caller called cache_write
        raise ValueError(f"dsahal.cache_write: {exc}") from None
    block, offset = split_slots(slots[keep], pages.shape[1])
    pages[block, offset] = records  # advanced-index assignment writes through a strided view


def read_tokens(pages: torch.Tensor, slots: torch.Tensor, kind: str, fmt: str, scale=None) -> torch.Tensor:
    """Dequantised tokens at ``slots`` (any shape ``[*S]``, all valid) -> ``[*S, dim]`` fp32."""
    spec = cache_format(kind, fmt)
    flat = slots.reshape(-1)
    block, offset = split_slots(flat, pages.shape[1])
    values = spec.unpack(pages[block, offset], scale)
    return values.reshape(*slots.shape, spec.dim)
