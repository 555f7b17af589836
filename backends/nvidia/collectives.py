"""Collectives on NCCL through ``torch.distributed``, and the exact DCP top-k merge built from the
Triton top-k: each rank's local top-k, one all-gather of (score, global id), and a top-k over the
candidates laid out in global-id order so that the kernel's smaller-column tie rule is the
smaller-global-position rule."""
from __future__ import annotations

import torch
import torch.distributed as dist

from dsahal.ops.collectives import group_rank_and_size


def all_gather(x, group):
    """``x`` -> ``[W, *x.shape]``: one ``all_gather_into_tensor`` (no per-rank list, no stack copy)."""
    _, world = group_rank_and_size(group)
    if world == 1:
        return x.unsqueeze(0).clone()
    out = x.new_empty((world, *x.shape))
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


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


def topk_merge(local_scores, local_lengths, k, group):
    """Exact global top-k of a context interleaved over the ranks (position p on rank p % W)."""
    from . import ops

    rank, world = group_rank_and_size(group)
    local = ops.topk(local_scores, local_lengths, k).long()  # [T, k] local positions, -1 padded
    valid = local >= 0
    scores = torch.where(valid, local_scores.gather(1, local.clamp_min(0)), float("-inf"))
    ids = torch.where(valid, local * world + rank, torch.full_like(local, torch.iinfo(torch.int32).max))
    all_scores = all_gather(scores, group).permute(1, 0, 2).reshape(scores.shape[0], -1)
    all_ids = all_gather(ids, group).permute(1, 0, 2).reshape(ids.shape[0], -1)
    order = torch.argsort(all_ids, dim=1, stable=True)
    sorted_ids = all_ids.gather(1, order)
    sorted_scores = all_scores.gather(1, order).contiguous()
    widths = torch.full((scores.shape[0],), sorted_scores.shape[1], dtype=torch.int32, device=scores.device)
    chosen = ops.topk(sorted_scores, widths, k).long()
    out = torch.where(chosen >= 0, sorted_ids.gather(1, chosen.clamp_min(0)), -1)
    return out.to(torch.int32)
