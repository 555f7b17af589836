"""Reference collectives on ``torch.distributed`` (gloo, NCCL, RCCL alike)."""
from __future__ import annotations

import torch
import torch.distributed as dist



def _world(group) -> int:
    """The group's size; 1 when torch.distributed is not initialised (a single rank)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def all_gather(x, group):
    world = _world(group)
    if world == 1:
        return x.unsqueeze(0).clone()
    if x.is_cuda:  # NCCL/RCCL: one call into the output, no per-rank list and stack copy
        out = x.new_empty((world, *x.shape))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.stack(parts)


def all_to_all(x, output_split_sizes, input_split_sizes, group):
    world = _world(group)
    if world == 1:
        return x.clone()
    if output_split_sizes is None:
        out_rows = x.shape[0]
    else:
        out_rows = int(sum(output_split_sizes))
    out = x.new_empty((out_rows, *x.shape[1:]))
    dist.all_to_all_single(
        out, x.contiguous(),
        output_split_sizes=None if output_split_sizes is None else [int(s) for s in output_split_sizes],
        input_split_sizes=None if input_split_sizes is None else [int(s) for s in input_split_sizes],
        group=group,
    )
    return out
