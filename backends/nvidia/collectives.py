"""Collectives on NCCL through ``torch.distributed``, and the exact DCP top-k merge.

The collectives are the reference's own (they are plain ``torch.distributed`` calls, which on CUDA
tensors go to NCCL); the merge is the packed exact algorithm of :mod:`dsahal.distributed.merge`
(32-bit candidates, targeted resends, a raw-score band round), run on the GPU tensors with the
backend's collectives, so DCP decode sends ~10x less than a generic merge at W = 8.
"""
from __future__ import annotations

from dsahal.distributed.merge import exact_topk_merge
from dsahal.reference.collectives import all_gather, all_to_all


def topk_merge(local_scores, local_lengths, k, group):
    """Exact global top-k of a context interleaved over the ranks (position p on rank p % W)."""
    return exact_topk_merge(local_scores, local_lengths, k, group)


__all__ = ["all_gather", "all_to_all", "topk_merge"]
