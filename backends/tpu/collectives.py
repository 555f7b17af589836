"""Collectives for XLA tensors over a ``torch.distributed`` group of the ``xla`` backend.

torch-xla's process group (``init_process_group("xla")``) lowers ``all_gather_into_tensor`` and
``all_to_all_single`` to XLA's AllGather / AllToAll, which run over the TPU's ICI; at world size
1 (no process group) both are the identity. XLA's AllToAll moves equal slices only, so uneven
split sizes are padded to the largest split of any rank and trimmed after the exchange.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from dsahal.ops.collectives import group_rank_and_size


def all_gather(x, group):
    """``[*S]`` -> ``[W, *S]``, row r from rank r."""
    _, world = group_rank_and_size(group)
    if world == 1:
        return x.unsqueeze(0).clone()
    out = x.new_empty((world, *x.shape))
    dist.all_gather_into_tensor(out, x.unsqueeze(0).contiguous(), group=group)
    return out


def _equal_exchange(x, world, group):
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group)
    return out


def all_to_all(x, output_split_sizes, input_split_sizes, group):
    """Slice r of dim 0 goes to rank r; the result stacks what each rank sent here, in rank order."""
    rank, world = group_rank_and_size(group)
    if world == 1:
        return x.clone()
    if input_split_sizes is None and output_split_sizes is None:
        return _equal_exchange(x, world, group)
    sends = [int(s) for s in (input_split_sizes or [x.shape[0] // world] * world)]
    receives = [int(s) for s in (output_split_sizes or [x.shape[0] // world] * world)]
    # Every rank must pad to the same size: agree on the largest split anywhere (one small
    # exchange of host integers; the split sizes are host metadata already).
    local_max = torch.tensor([max(sends + receives)], dtype=torch.int32, device=x.device)
    widest = int(all_gather(local_max, group).max())
    padded = x.new_zeros((world * widest, *x.shape[1:]))
    start = 0
    for peer, rows in enumerate(sends):
        padded[peer * widest : peer * widest + rows] = x[start : start + rows]
        start += rows
    exchanged = _equal_exchange(padded, world, group)
    return torch.cat([exchanged[peer * widest : peer * widest + rows] for peer, rows in enumerate(receives)])
