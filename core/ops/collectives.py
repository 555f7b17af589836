"""Collectives over a ``torch.distributed`` process group, dispatched through the backend so an
XLA backend can use its own. Every distributed algorithm in dsahal is written against these."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..registry.state import active_table
from ._validate import ShapeBinder


def group_rank_and_size(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) when ``torch.distributed`` is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def all_gather(x: torch.Tensor, group=None, *, check: bool = True) -> torch.Tensor:
    """Gather ``x`` from every rank of ``group``.

    Args:
        x: any shape ``[*S]``, the same shape and dtype on every rank.
        group: process group (None: default group, or a single rank when not initialised).

    Returns:
        ``[W, *S]``, row ``r`` from rank ``r``. Collective.
    """
    if check and not isinstance(x, torch.Tensor):
        ShapeBinder("all_gather").fail(f"argument 'x' expected a torch.Tensor, got {type(x).__name__}",
                                       type_error=True)
    return active_table().dispatch["all_gather"](x, group)


def all_to_all(
    x: torch.Tensor,
    output_split_sizes: Optional[Sequence[int]] = None,
    input_split_sizes: Optional[Sequence[int]] = None,
    group=None,
    *,
    check: bool = True,
) -> torch.Tensor:
    """Exchange slices of dim 0: slice ``r`` of ``x`` goes to rank ``r``; the result stacks what each
    rank sent here, in rank order.

    Args:
        x: ``[N, *S]``.
        output_split_sizes / input_split_sizes: rows received from / sent to each rank
            (None: ``N / W`` each, N divisible by W).
        group: process group.

    Returns:
        ``[sum(output_split_sizes), *S]``. Collective.
    """
    if check:
        v = ShapeBinder("all_to_all")
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            v.fail(f"argument 'x' expected a tensor of at least one dim, got {type(x).__name__}", type_error=True)
        _, world = group_rank_and_size(group)
        for name, sizes in (("input_split_sizes", input_split_sizes), ("output_split_sizes", output_split_sizes)):
            if sizes is not None and (len(sizes) != world or any(int(s) < 0 for s in sizes)):
                v.fail(f"argument '{name}' expected {world} non-negative sizes, got {list(sizes)}")
        if input_split_sizes is not None and sum(input_split_sizes) != x.shape[0]:
            v.fail(f"argument 'input_split_sizes' expected sizes summing to x.shape[0]={x.shape[0]}, "
                   f"got {list(input_split_sizes)}")
        if input_split_sizes is None and x.shape[0] % world:
            v.fail(f"argument 'x' expected dim 0 divisible by the world size {world}, got {x.shape[0]}")
    return active_table().dispatch["all_to_all"](x, output_split_sizes, input_split_sizes, group)
