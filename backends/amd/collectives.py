"""Collectives on RCCL through torch.distributed (AITER's custom all-gather where it is enabled) and
the DCP top-k merge with a selectable algorithm. The fused DSA layer is not overridden: the registry
composes it from the backend's routed ops. Signatures are the backend-facing argument lists of
:mod:`dsahal.ops`."""
from __future__ import annotations

import os

from dsahal.ops.collectives import group_rank_and_size
from dsahal.reference.collectives import all_gather as reference_all_gather
from dsahal.reference.collectives import all_to_all
from dsahal.registry import resolve_lazy

from . import routes

MERGE_ENV = "DSAHAL_AMD_TOPK_MERGE"
MERGE_ALGORITHMS = {
    # Scores only on the wire; exact on the raw fp32 scores (see score_only_merge.py).
    "score_only": "dsahal.backends.amd.score_only_merge:score_only_topk_merge",
    # The packed 32-bit candidates of dsahal.distributed; exact on the raw fp32 scores too.
    "packed": "dsahal.distributed.merge:exact_topk_merge",
}
DEFAULT_MERGE = "score_only"


def merge_algorithm(name: str | None = None):
    """The top-k merge named (or in ``DSAHAL_AMD_TOPK_MERGE``, default ``score_only``)."""
    name = name or os.environ.get(MERGE_ENV) or DEFAULT_MERGE
    if name not in MERGE_ALGORITHMS:
        raise ValueError(f"dsahal.topk_merge: {MERGE_ENV} expected one of {sorted(MERGE_ALGORITHMS)}, got {name!r}")
    return resolve_lazy(MERGE_ALGORITHMS[name])


def topk_merge(local_scores, local_lengths, k, group):
    return merge_algorithm()(local_scores, local_lengths, k, group)


def all_gather(x, group):
    """``x`` -> ``[W, *x.shape]``: AITER's custom all-gather where its route is on, else RCCL."""
    _, world = group_rank_and_size(group)
    if world > 1 and x.device.type == "cuda" and routes.path_status().get("aiter.all_gather", "absent") == "":
        from .vendor_ops import all_gather as aiter_all_gather

        return aiter_all_gather(x, group)
    return reference_all_gather(x, group)


__all__ = ["all_gather", "all_to_all", "merge_algorithm", "topk_merge"]
