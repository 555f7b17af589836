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


# What one rank tells its peers of its all_gather input: [dims, dtype code, size of dim 0, ...], padded.
_MAX_EXCHANGED_DIMS = 64
_DTYPES = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)


def exchange_ints(v: ShapeBinder, what: str, values: Sequence[int], like, group, rank: int,
                  world: int) -> list[list[int]]:
    """Every rank's ``values`` (the same count on each), row ``r`` from rank ``r``: one small all-gather that
    op ``v.op``'s validator uses so that every rank sees the same facts and raises the same error, where a call
    whose ranks disagree would otherwise hang, abort the process or scramble rows. Runs on the CPU for gloo, on
    ``like``'s device for the GPU transports (the current CUDA device when ``like`` is no tensor: a rank whose
    own checks failed); reads the result on the host (not while tracing or capturing a graph). A transport
    failure (a dead or silent peer) is a ``RuntimeError`` naming the op and ``what``."""
    if str(dist.get_backend(group)) == "gloo":
        device = torch.device("cpu")
    else:
        device = like.device if isinstance(like, torch.Tensor) else torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor(list(values), dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    try:
        dist.all_gather(everyone, mine, group=group)
    except RuntimeError as exc:
        raise RuntimeError(f"dsahal.{v.op}: the all-gather of every rank's {what} (the check that the ranks agree) "
                           f"failed on rank {rank} of {world}: {exc}") from exc
    return torch.stack(everyone).cpu().tolist()


class LocalChecks:
    """A collective op's rank-local argument checks, run as ``with checks: ...``: their error (``ValueError`` /
    ``TypeError``) is held, not raised, so that this rank still joins the agreement exchange of
    :func:`same_on_every_rank`, where its peers learn of it and raise too. Raised at once, it left its peers
    waiting in that exchange for a rank that had gone (until the process group's timeout: 30 minutes on gloo),
    or paired their exchange with this rank's next collective."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def __enter__(self) -> "LocalChecks":
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is not None and issubclass(kind, (ValueError, TypeError)):
            self.error = error
            return True
        return False


def _can_exchange(like) -> bool:
    """Whether the agreement exchange can run now (not while tracing or capturing a graph; not on meta tensors)."""
    if isinstance(like, torch.Tensor):
        return can_read_values(like)
    return not torch.compiler.is_compiling() and not (torch.cuda.is_available()
                                                      and torch.cuda.is_current_stream_capturing())


def agreed_exchange(v: ShapeBinder, what: str, values: Optional[Sequence[int]], like, group, rank: int, world: int,
                    checks: LocalChecks, count: int) -> Optional[list[list[int]]]:
    """:func:`exchange_ints` of this rank's ``count`` facts ``values`` after its local ``checks``: a rank whose
    checks failed sends a flag instead and raises its own error, every other rank one naming it; else every
    rank's facts, row ``r`` from rank ``r``. None (nothing exchanged) for one rank and where contents cannot be
    read (tracing, graph capture), a held error then raised as it is: the transport's own checks remain."""
    held = checks.error
    if world == 1 or not _can_exchange(like):
        if held is not None:
            raise held
        return None
    table = exchange_ints(v, what, [1] + [0] * count if held is not None else [0, *values], like, group, rank, world)
    failed = [r for r, facts in enumerate(table) if facts[0]]
    if held is not None:
        raise type(held)(f"{held} (this is rank {rank}; every rank of the call raises: its argument checks "
                         f"failed on rank(s) {failed})") from None
    if failed:
        v.fail(f"the argument checks of this call failed on rank(s) {failed} (each raised its reason; this is rank "
               f"{rank}, and every rank of the call raises)")
    return [facts[1:] for facts in table]


def same_on_every_rank(v: ShapeBinder, name: str, what: str, values: Optional[Sequence[int]], like, group,
                       rank: int, world: int, describe, checks: LocalChecks, count: int) -> None:
    """Argument ``name``'s facts ``values`` (``what`` they are, ``count`` integers) must be the same on every
    rank: one :func:`agreed_exchange` (which also carries each rank's local ``checks``), then every rank raises
    the same error naming each rank's ``describe(row)``."""
    table = agreed_exchange(v, what, values, like, group, rank, world, checks, count)
    if table is not None and any(facts != table[0] for facts in table):
        ranks = ", ".join(f"rank {r}: {describe(facts)}" for r, facts in enumerate(table))
        v.fail(f"argument '{name}' expected the same {what} on every rank, got {ranks} (this is rank {rank}; "
               f"every rank raises this)")


def _describe(row: list[int]) -> str:
    """``(3, 4) float32`` from an all_gather descriptor row."""
    return f"{tuple(row[2:2 + row[0]])} {str(_DTYPES[row[1]]).replace('torch.', '')}"


def validate_all_gather(x, group) -> None:
    """Local checks, then (several ranks, contents readable) one small all-gather of every rank's shape and
    dtype, so that every rank raises the same error when they differ: the transports do not check it
    (gloo aborted the process, killing it with SIGABRT, while its peer returned rows cut from the wrong
    sizes; NCCL hangs or scrambles). A rank whose local checks fail tells its peers in that exchange
    (:class:`LocalChecks`), so they raise too instead of waiting for it."""
    v = ShapeBinder("all_gather")
    rank, world = checked_rank_and_size(v, group)
    descriptor = None
    with LocalChecks() as checks:
        if not isinstance(x, torch.Tensor):
            v.fail(f"argument 'x' expected a torch.Tensor, got {type(x).__name__}", type_error=True)
        if x.dim() > _MAX_EXCHANGED_DIMS:
            v.fail(f"argument 'x' expected at most {_MAX_EXCHANGED_DIMS} dims, got {x.dim()}")
        descriptor = [x.dim(), _DTYPES.index(x.dtype), *x.shape] + [0] * (_MAX_EXCHANGED_DIMS - x.dim())
    same_on_every_rank(v, "x", "shape and dtype", descriptor, x, group, rank, world, _describe, checks,
                       2 + _MAX_EXCHANGED_DIMS)


def validate_all_to_all(x, output_split_sizes, input_split_sizes, group) -> None:
    """Local checks, then (several ranks, contents readable) one small all-gather of every rank's split sizes
    so that every rank sees the same ``W x W`` send/receive matrix and raises the same error when a rank
    expects other row counts than its peers send it (which would otherwise hang or scramble rows). A rank
    whose local checks fail tells its peers in that exchange (:class:`LocalChecks`)."""
    v = ShapeBinder("all_to_all")
    rank, world = checked_rank_and_size(v, group)
    facts = None
    with LocalChecks() as checks:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            v.fail(f"argument 'x' expected a tensor of at least one dim, got {type(x).__name__}", type_error=True)
        input_split_sizes = v.split_sizes("input_split_sizes", input_split_sizes, world)
        output_split_sizes = v.split_sizes("output_split_sizes", output_split_sizes, world)
        if input_split_sizes is not None and sum(input_split_sizes) != x.shape[0]:
            v.fail(f"argument 'input_split_sizes' expected sizes summing to x.shape[0]={x.shape[0]}, "
                   f"got {list(input_split_sizes)}")
        if input_split_sizes is None and x.shape[0] % world:
            v.fail(f"argument 'x' expected dim 0 divisible by the world size {world}, got {x.shape[0]}")
        if output_split_sizes is None and x.shape[0] % world:  # None receives x.shape[0] / W rows from each rank
            v.fail(f"argument 'output_split_sizes' expected sizes, or None with x.shape[0] divisible by the world "
                   f"size {world}, got None with x.shape[0]={x.shape[0]}")
        sends = input_split_sizes if input_split_sizes is not None else [x.shape[0] // world] * world
        receives = output_split_sizes if output_split_sizes is not None else [x.shape[0] // world] * world
        if world == 1 and receives != sends:
            v.fail(f"argument 'output_split_sizes' expected the rows this single rank sends itself {sends}, "
                   f"got {receives}")
        facts = sends + receives
    # row r: rank r's sends, then its receives
    table = agreed_exchange(v, "split sizes", facts, x, group, rank, world, checks, 2 * world)
    if table is None:
        return
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
