"""The contract every cache format implements: bytes per token, pack, unpack, error bound.

A format turns one token's vector (``dim`` values) into a fixed-size byte record
(``token_bytes``) stored in a page, and back. Pages are ``uint8`` tensors
``[num_blocks, block_tokens, token_bytes]``; kernels reinterpret the bytes in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheFormat:
    """One storage format of the latent cache (``kind="latent"``) or the index-key cache (``kind="index"``).

    Subclasses implement :meth:`pack`, :meth:`unpack` and :meth:`error_bound`.
    ``needs_tensor_scale`` is True when the format is scaled by one external fp32 scale per
    tensor (FP8 per-tensor latent); the scale is then passed to every op that reads or writes it.
    """

    name: str
    kind: str
    dim: int
    token_bytes: int
    needs_tensor_scale: bool = False

    def pack(self, values: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """values ``[N, dim]`` (any float dtype) -> bytes ``[N, token_bytes]`` uint8."""
        raise NotImplementedError

    def unpack(self, records: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """bytes ``[N, token_bytes]`` uint8 -> values ``[N, dim]`` float32."""
        raise NotImplementedError

    def error_bound(self, values: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """Elementwise bound ``|unpack(pack(x)) - x| <= bound`` for finite, in-range x; ``[N, dim]`` fp32."""
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret the last dim of a contiguous tensor as bytes: ``[N, d]`` -> ``[N, d*itemsize]`` uint8."""
    return t.contiguous().view(torch.uint8)


def from_bytes(records: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`as_bytes`: ``[N, b]`` uint8 -> ``[N, b/itemsize]`` of ``dtype``."""
    return records.contiguous().view(dtype)
