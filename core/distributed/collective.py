"""The collectives the distributed algorithms use, through ``dsahal.ops`` (so a backend may supply its
own), with failures turned into one clear error.

A peer that dies makes gloo/NCCL raise at once (connection reset); a peer that stops answering
makes them raise after the process group's timeout (the ``timeout`` of ``init_process_group``,
set by :func:`dsahal.distributed.init_distributed`). Either way the caller gets a
:class:`DistributedFault` naming the step, this rank and the timeout, never a hang.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional, Sequence

import torch

from .. import ops

# Set by init_distributed so error messages can state the timeout in force.
_configured_timeout_s: Optional[float] = None


class DistributedFault(RuntimeError):
    """A collective failed because a peer rank died or stopped answering within the timeout."""


def set_configured_timeout(seconds: Optional[float]) -> None:
    global _configured_timeout_s
    _configured_timeout_s = seconds


@contextmanager
def collective_step(what: str, group=None):
    """Run one collective step; a transport failure becomes :class:`DistributedFault`."""
    try:
        yield
    except DistributedFault:
        raise
    except RuntimeError as exc:  # gloo and NCCL (DistBackendError) failures are RuntimeErrors
        rank, world = ops.group_rank_and_size(group)
        timeout = (f"{_configured_timeout_s:g} s" if _configured_timeout_s is not None
                   else "the timeout given to init_process_group")
        raise DistributedFault(
            f"dsahal.distributed: {what} failed on rank {rank} of {world}: a peer rank died or did not "
            f"answer within the process group's timeout ({timeout}). Underlying error: {exc}"
        ) from exc


def all_gather(x: torch.Tensor, group, what: str) -> torch.Tensor:
    """``dsahal.ops.all_gather`` under :func:`collective_step`: ``[*S]`` -> ``[W, *S]``."""
    with collective_step(what, group):
        return ops.all_gather(x, group, check=False)


def all_to_all(x: torch.Tensor, output_split_sizes: Optional[Sequence[int]],
               input_split_sizes: Optional[Sequence[int]], group, what: str) -> torch.Tensor:
    """``dsahal.ops.all_to_all`` under :func:`collective_step`."""
    with collective_step(what, group):
        return ops.all_to_all(x, output_split_sizes, input_split_sizes, group, check=False)


def all_gather_varying(x: torch.Tensor, counts: Sequence[int], group, what: str) -> list[torch.Tensor]:
    """Gather 1-d tensors whose lengths differ by rank (every rank knows all ``counts``).

    Implemented as one all-to-all in which this rank sends the same ``x`` to every rank, so each
    rank's payload crosses the wire once per peer, as in an all-gather, with no padding.

    Args:
        x: ``[counts[rank]]``; counts: the length on every rank.

    Returns:
        ``W`` tensors, the ``r``-th of length ``counts[r]``.
    """
    rank, world = ops.group_rank_and_size(group)
    if x.dim() != 1 or x.shape[0] != counts[rank]:
        raise ValueError(f"dsahal.distributed.all_gather_varying: argument 'x' expected shape [{counts[rank]}], "
                         f"got {list(x.shape)}")
    received = all_to_all(x.repeat(world), list(counts), [x.shape[0]] * world, group, what)
    return list(torch.split(received, list(counts)))
