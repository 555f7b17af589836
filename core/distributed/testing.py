"""Run a function on W local processes joined by gloo: the harness of dsahal's distributed tests
(and of a vendor's own CI). Every process is started here and ended here, by its own handle."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import socket
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

import torch.distributed as dist


DEAD_GRACE_S = 3.0


@dataclass(frozen=True)
class RankOutcome:
    """What one rank did: returned ``value``, or raised ``error_type: error_message``, or ``timed_out``."""

    rank: int
    ok: bool
    value: Any = None
    error_type: str = ""
    error_message: str = ""
    traceback: str = ""
    timed_out: bool = False
    seconds: float = 0.0


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(fn, rank, world, port, args, env, results) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    os.environ.update(env)
    start = time.monotonic()
    try:
        value = fn(rank, world, *args)
        outcome = RankOutcome(rank, True, value=value, seconds=time.monotonic() - start)
    except BaseException as exc:  # reported to the parent, which decides what is a failure
        outcome = RankOutcome(rank, False, error_type=type(exc).__name__, error_message=str(exc),
                              traceback=traceback.format_exc(), seconds=time.monotonic() - start)
    # Plain pickle copies tensors by value; the queue's own pickler would pass shared-memory handles
    # that die with this process.
    results.put(pickle.dumps(outcome))


def run_on_ranks(fn: Callable[..., Any], world: int, *, args: tuple = (), timeout_s: float = 120.0,
                 rank_env: Optional[Mapping[int, Mapping[str, str]]] = None,
                 wait_for: Optional[Iterable[int]] = None) -> list[RankOutcome]:
    """Start ``world`` spawned processes running ``fn(rank, world, *args)`` with the torchrun environment
    variables set (127.0.0.1, a free port); ``rank_env[r]`` overrides rank r's environment.

    ``fn`` must be importable by name (a module-level function) and return something picklable.
    Ranks still running after ``timeout_s``, or once every rank in ``wait_for`` (default: all) has
    reported, are killed and reported ``timed_out``.

    Returns:
        One :class:`RankOutcome` per rank, in rank order.
    """
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_local_port()
    processes = [context.Process(target=_rank_main, daemon=True,
                                 args=(fn, rank, world, port, args, dict((rank_env or {}).get(rank, {})), results))
                 for rank in range(world)]
    for process in processes:
        process.start()
    outcomes: dict[int, RankOutcome] = {}
    awaited = set(range(world) if wait_for is None else wait_for)
    deadline = time.monotonic() + timeout_s
    dead_since: dict[int, float] = {}
    try:
        while not awaited <= set(outcomes) and time.monotonic() < deadline:
            try:
                outcome = pickle.loads(results.get(timeout=0.2))
                outcomes[outcome.rank] = outcome
            except queue.Empty:  # look for ranks that died without reporting
                now = time.monotonic()
                for rank, process in enumerate(processes):
                    if rank in outcomes or process.is_alive():
                        continue
                    # A large result may still be in the pipe after its sender exited: allow a grace period.
                    if now - dead_since.setdefault(rank, now) > DEAD_GRACE_S:
                        outcomes[rank] = RankOutcome(rank, False, error_type="ProcessDied",
                                                     error_message=f"exit code {process.exitcode}")
    finally:
        for rank, process in enumerate(processes):
            if process.is_alive():
                process.kill()
            process.join(5)
        results.close()
    return [outcomes.get(rank, RankOutcome(rank, False, timed_out=True, error_type="Timeout",
                                           error_message="still running when the harness stopped"))
            for rank in range(world)]


@dataclass
class CollectiveBytes:
    """Bytes this rank handed to ``torch.distributed`` collectives for delivery to its peers."""

    sent_to_peers: int = 0
    calls: list[str] = field(default_factory=list)


@contextmanager
def count_collective_bytes():
    """Count what ``torch.distributed.all_gather`` / ``all_gather_into_tensor`` / ``all_to_all_single``
    send to other ranks while inside.

    all_gather(_into_tensor): the input's bytes once per peer; all_to_all_single: the bytes of the
    slices addressed to other ranks. Counting at the torch.distributed call, below dsahal's op
    dispatch, measures any algorithm whose collectives call these module functions.
    """
    counter = CollectiveBytes()
    original_gather, original_a2a = dist.all_gather, dist.all_to_all_single
    original_gather_tensor = dist.all_gather_into_tensor

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        world = dist.get_world_size(group)
        counter.sent_to_peers += tensor.numel() * tensor.element_size() * (world - 1)
        counter.calls.append("all_gather")
        return original_gather(tensor_list, tensor, group=group, async_op=async_op)

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        world = dist.get_world_size(group)
        counter.sent_to_peers += input_tensor.numel() * input_tensor.element_size() * (world - 1)
        counter.calls.append("all_gather_into_tensor")
        return original_gather_tensor(output_tensor, input_tensor, group=group, async_op=async_op)

    def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        row_bytes = input[0].numel() * input.element_size() if input.shape[0] else 0
        splits = input_split_sizes or [input.shape[0] // world] * world
        counter.sent_to_peers += row_bytes * (sum(splits) - splits[rank])
        counter.calls.append("all_to_all_single")
        return original_a2a(output, input, output_split_sizes=output_split_sizes,
                            input_split_sizes=input_split_sizes, group=group, async_op=async_op)

    dist.all_gather, dist.all_to_all_single = all_gather, all_to_all_single
    dist.all_gather_into_tensor = all_gather_into_tensor
    try:
        yield counter
    finally:
        dist.all_gather, dist.all_to_all_single = original_gather, original_a2a
        dist.all_gather_into_tensor = original_gather_tensor
