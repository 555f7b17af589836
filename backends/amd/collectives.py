"""Collectives on RCCL through torch.distributed (AITER's custom all-gather where it is enabled),
the DCP top-k merge with a selectable algorithm, and the fused DSA layer as a composition of the
backend's routed ops. Signatures are the backend-facing argument lists of :mod:`dsahal.ops`."""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from dsahal.ops.collectives import group_rank_and_size
from dsahal.registry import resolve_lazy

from . import routes

MERGE_ENV = "DSAHAL_AMD_TOPK_MERGE"
MERGE_ALGORITHMS = {
    # Scores only on the wire; exact on the raw fp32 scores (see score_only_merge.py).
    "score_only": "dsahal.backends.amd.score_only_merge:score_only_topk_merge",
    # The packed 32-bit candidates of dsahal.distributed; exact on its merge-rounded scores.
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
    """``x`` -> ``[W, *x.shape]``."""
    _, world = group_rank_and_size(group)
    if world == 1:
        return x.unsqueeze(0).clone()
    if x.device.type == "cuda" and routes.router().status.get("aiter.all_gather", "absent") == "":
        from .vendor_ops import all_gather as aiter_all_gather

        return aiter_all_gather(x, group)
    if x.device.type == "cuda":
        out = x.new_empty((world, *x.shape))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.stack(parts)


def all_to_all(x, output_split_sizes, input_split_sizes, group):
    _, world = group_rank_and_size(group)
    if world == 1:
        return x.clone()
    rows = x.shape[0] if output_split_sizes is None else int(sum(output_split_sizes))
    out = x.new_empty((rows, *x.shape[1:]))
    dist.all_to_all_single(
        out, x.contiguous(),
        output_split_sizes=None if output_split_sizes is None else [int(s) for s in output_split_sizes],
        input_split_sizes=None if input_split_sizes is None else [int(s) for s in input_split_sizes],
        group=group,
    )
    return out


def dsa_attention(q_index, index_weights, index_pages, index_fmt, q, kv_pages, kv_fmt, kv_scale, block_table,
                  req_ids, positions, topk, max_context, softmax_scale):
    """Indexer -> top-k -> slots -> sparse MLA through the public ops, so each stage takes its own
    best AMD path (or the reference, logged, where none accepts)."""
    from dsahal import ops

    scores = ops.indexer_score(q_index, index_weights, index_pages, block_table, req_ids, positions,
                               index_fmt=index_fmt, max_context=max_context, check=False)
    lengths = torch.clamp(positions.to(torch.int32) + 1, max=max_context)
    chosen = ops.topk(scores, lengths, topk, check=False)
    slots = ops.positions_to_slots(chosen, req_ids, block_table, index_pages.shape[1], check=False)
    return ops.sparse_mla(q, kv_pages, slots, kv_fmt=kv_fmt, kv_scale=kv_scale, softmax_scale=softmax_scale,
                          check=False)
