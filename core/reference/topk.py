"""Reference top-k (one device) and the distributed top-k stated as its definition.

The oracle imports nothing it judges: ``topk_merge`` here is not a merge algorithm but the op's
definition — gather every rank's whole local row, put the global row back together and take the
single-device ``topk`` of it. The packed exact merge that backends ship
(:mod:`dsahal.distributed.merge`) and the generic merge it is measured against
(:mod:`dsahal.distributed.generic_merge`) are checked against this.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

NEG_INF = float("-inf")


def topk(scores, lengths, k):
    """The ``k`` largest entries of each row among the first ``lengths[t]``.

    Args:
        scores: ``[T, N]`` float; lengths: ``[T]`` int, valid entries per row.
        k: entries to keep.

    Returns:
        ``[T, k]`` int32 column indices, best first; among equal scores the smaller index first (the
        tie rule); ``-inf`` and entries at or past ``lengths[t]`` never chosen; -1 padding last.
    """
    tokens, width = scores.shape
    columns = torch.arange(width, device=scores.device)
    masked = torch.where(columns[None, :] < lengths[:, None].long(), scores, torch.full_like(scores, NEG_INF))
    # A stable sort keeps equal scores in column order, so the smaller index comes first: the tie rule.
    order = torch.sort(masked, dim=1, descending=True, stable=True)
    values, ids = order.values[:, :k], order.indices[:, :k]
    ids = torch.where(values == NEG_INF, torch.full_like(ids, -1), ids)
    if width < k:
        ids = torch.cat([ids, ids.new_full((tokens, k - width), -1)], dim=1)
    return ids.to(torch.int32)


def _rank_and_world(group) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) when ``torch.distributed`` is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("dsahal.topk_merge: argument 'group' expected None when torch.distributed is not "
                             f"initialised, got {group!r}")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _gather(x: torch.Tensor, group, rank: int, world: int, what: str) -> torch.Tensor:
    """``[*S]`` from every rank -> ``[W, *S]`` (row r from rank r), by a plain ``torch.distributed``
    all-gather (gloo, NCCL and RCCL alike)."""
    parts = [torch.empty_like(x) for _ in range(world)]
    try:
        dist.all_gather(parts, x.contiguous(), group=group)
    except RuntimeError as exc:  # a dead or silent peer: name the op and the step, keep the cause
        raise RuntimeError(f"dsahal.topk_merge (reference): the all-gather of {what} failed on rank {rank} of "
                           f"{world}: {exc}") from exc
    return torch.stack(parts)


def topk_merge(local_scores, local_lengths, k, group):
    """The global top-k of a context interleaved over the ``W`` ranks of ``group``, by definition.

    Global position ``p`` lives on rank ``p % W`` at local index ``p // W`` (``dsahal.ops.topk_merge``,
    :mod:`dsahal.distributed.sharding`). Every rank gathers all ranks' full local scores ``[W, T, N]``
    and lengths ``[W, T]``, masks each rank's entries at or past its own length, interleaves the rows
    into the global ``[T, W·N]`` row (column ``l·W + r`` is rank ``r``'s local entry ``l``) and returns
    :func:`topk` of it. With the lengths ``ceil((L - r) / W)`` of a context of length ``L`` the masked
    entries are exactly the global positions ``>= L``. Sends ``W - 1`` copies of ``4·T·(N + 2)``
    bytes per rank: the measure of correctness, not of speed.

    Returns:
        ``[T, k]`` int32 global positions, identical on every rank. Collective.
    """
    rank, world = _rank_and_world(group)
    tokens, width = local_scores.shape
    if world == 1:
        return topk(local_scores, local_lengths, k)
    scores = _gather(local_scores, group, rank, world, "the local scores")  # [W, T, N]
    lengths = _gather(local_lengths.to(torch.int64), group, rank, world, "the local lengths")  # [W, T]
    columns = torch.arange(width, device=scores.device)
    valid = columns[None, None, :] < lengths[:, :, None]  # [W, T, N]
    scores = torch.where(valid, scores, torch.full_like(scores, NEG_INF))
    # [W, T, N] -> [T, N, W] -> [T, N·W]: local entry l of rank r lands in column l·W + r.
    global_scores = scores.permute(1, 2, 0).reshape(tokens, width * world)
    global_lengths = torch.full((tokens,), width * world, dtype=torch.int64, device=scores.device)
    return topk(global_scores, global_lengths, k)
