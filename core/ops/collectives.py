"""Collectives over a ``torch.distributed`` process group, dispatched through the backend so an
XLA backend can use its own. Every distributed algorithm in dsahal is written against these."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..registry.state import active_table
from ._validate import ShapeBinder, can_read_values


def group_rank_and_size(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) when ``torch.distributed`` is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("a process group was given but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def checked_rank_and_size(v: ShapeBinder, group) -> tuple[int, int]:
    """:func:`group_rank_and_size` for op ``v.op``: a group given without an initialised
    ``torch.distributed`` is that op's argument error, not a bare message."""
    if group is not None and not (dist.is_available() and dist.is_initialized()):
        v.fail(f"argument 'group' expected a process group of an initialised torch.distributed "
               f"(init_process_group first), got {type(group).__name__} while torch.distributed is not initialised")
    return group_rank_and_size(group)


def validate_all_gather(x, group) -> None:
    v = ShapeBinder("all_gather")
    if not isinstance(x, torch.Tensor):
        v.fail(f"argument 'x' expected a torch.Tensor, got {type(x).__name__}", type_error=True)
    checked_rank_and_size(v, group)


def validate_all_to_all(x, output_split_sizes, input_split_sizes, group) -> None:
    """Local checks, then (several ranks, contents readable) one small all-gather of every rank's split sizes
    so that every rank sees the same ``W x W`` send/receive matrix and raises the same error when a rank
    expects other row counts than its peers send it (which would otherwise hang or scramble rows)."""
    v = ShapeBinder("all_to_all")
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        v.fail(f"argument 'x' expected a tensor of at least one dim, got {type(x).__name__}", type_error=True)
    rank, world = checked_rank_and_size(v, group)
    input_split_sizes = v.split_sizes("input_split_sizes", input_split_sizes, world)
    output_split_sizes = v.split_sizes("output_split_sizes", output_split_sizes, world)
    if input_split_sizes is not None and sum(input_split_sizes) != x.shape[0]:
        v.fail(f"argument 'input_split_sizes' expected sizes summing to x.shape[0]={x.shape[0]}, "
               f"got {list(input_split_sizes)}")
    if input_split_sizes is None and x.shape[0] % world:
        v.fail(f"argument 'x' expected dim 0 divisible by the world size {world}, got {x.shape[0]}")
    if output_split_sizes is None and x.shape[0] % world:  # None receives x.shape[0] / W rows from each rank
        v.fail(f"argument 'output_split_sizes' expected sizes, or None with x.shape[0] divisible by the world size "
               f"{world}, got None with x.shape[0]={x.shape[0]}")
    sends = input_split_sizes if input_split_sizes is not None else [x.shape[0] // world] * world
    receives = output_split_sizes if output_split_sizes is not None else [x.shape[0] // world] * world
    if world == 1:
        if receives != sends:
            v.fail(f"argument 'output_split_sizes' expected the rows this single rank sends itself {sends}, "
                   f"got {receives}")
        return
    if not can_read_values(x):
        return  # tracing or graph capture: no host exchange possible; the transport's own checks remain
    backend = dist.get_backend(group)
    device = torch.device("cpu") if str(backend) == "gloo" else x.device
    mine = torch.tensor(sends + receives, dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    table = torch.stack(everyone).cpu().tolist()  # row r: rank r's sends (W), then its receives (W)
    for r in range(world):
        expected = [table[s][r] for s in range(world)]
        got = table[r][world:]
        if got != expected:
            v.fail(f"argument 'output_split_sizes' expected the rows the ranks send to rank {r}, {expected}, "
                   f"got {got} on rank {r} (this is rank {rank}; every rank raises this)")


def all_gather(x: torch.Tensor, group=None, *, check: bool = True) -> torch.Tensor:
    """Gather ``x`` from every rank of ``group``.

    Args:
        x: any shape ``[*S]``, the same shape and dtype on every rank.
        group: process group (None: default group, or a single rank when not initialised; a group
            without an initialised ``torch.distributed`` is an error).

    Returns:
        ``[W, *S]``, row ``r`` from rank ``r``. Collective.
    """
    if check:
        validate_all_gather(x, group)
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
            (None: ``N / W`` each, N divisible by W). What a rank expects from each peer must be what
            that peer sends it.
        group: process group.
        check: validate; with several ranks this includes one small all-gather of every rank's split
            sizes (2W integers), so ``check`` must be the same on every rank of the call.

    Returns:
        ``[sum(output_split_sizes), *S]``. Collective.
    """
    if check:
        validate_all_to_all(x, output_split_sizes, input_split_sizes, group)
    return active_table().dispatch["all_to_all"](x, output_split_sizes, input_split_sizes, group)
