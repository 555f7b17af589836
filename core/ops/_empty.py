"""Calls on an empty cache (pages holding no record): the contract's result, no route asked.

The ops' checks let pages of no record through only with every slot and block-table entry -1 (their range is
``[-1, -1]``), and the contract defines those calls: every score -inf, ``o = 0`` with ``lse = -inf``. No kernel
runs for them: FlashMLA's sparse decode kernel read past an empty cache (compute-sanitizer on an H100, forty-first
session: a fault, then a dead CUDA context), and a backend's route should not have to handle a pool with no record.
"""
from __future__ import annotations

import torch

from ..formats import LATENT_NOPE_DIM


def holds_no_record(pages: torch.Tensor) -> bool:
    """``pages [num_blocks, block_tokens, bytes]`` hold no record (a shape test: no sync, traceable)."""
    return pages.shape[0] * pages.shape[1] == 0


def scores_without_keys(q: torch.Tensor, max_context: int) -> torch.Tensor:
    """``indexer_score``'s result with no key to read: ``[T, max_context]`` fp32, all -inf."""
    return torch.full((q.shape[0], max_context), float("-inf"), dtype=torch.float32, device=q.device)


def attention_without_keys(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sparse_mla``'s (and ``dsa_attention``'s) result with no key to attend: ``o [T, H, 512]`` zeros in q's
    dtype, ``lse [T, H]`` fp32 -inf."""
    tokens, heads = q.shape[0], q.shape[1]
    return (torch.zeros((tokens, heads, LATENT_NOPE_DIM), dtype=q.dtype, device=q.device),
            torch.full((tokens, heads), float("-inf"), dtype=torch.float32, device=q.device))
