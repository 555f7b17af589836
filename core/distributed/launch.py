"""Start-up of a dsahal process group: ``torchrun`` (or any env:// launcher), a timeout that turns a
dead or silent peer into an error, and a start-up check that every rank runs the same configuration.

Before the process group exists, every rank publishes ``{"world_size": W, **fingerprint}`` in the
rendezvous store. Rank 0 compares every other rank's record with its own; every other rank compares
rank 0's with its own. A difference raises :class:`StartupMismatch` naming each differing field and
both values ("dcp: rank 0 has 2, rank 1 has 4"), so ranks launched with different configs or world
sizes fail at once instead of hanging in a collective or computing garbage.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from .collective import set_configured_timeout

KEY_PREFIX = "dsahal/startup"
ACK_WAIT_S = 5.0  # rank 0 hosts the store: it lingers this long so peers can read its record


class StartupMismatch(RuntimeError):
    """Ranks were started with different configurations or world sizes, or a rank never joined."""


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    timeout_s: float
    device: torch.device


def _env_int(name: str, default: Optional[int]) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise StartupMismatch(f"dsahal.distributed: environment variable {name} is not set; launch with "
                                  "torchrun (or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")
        return default
    try:
        return int(value)
    except ValueError:
        raise StartupMismatch(f"dsahal.distributed: environment variable {name} expected an int, got {value!r}")


def describe_differences(mine: Mapping[str, Any], theirs: Mapping[str, Any], my_rank: int, their_rank: int) -> str:
    """``"key: rank A has x, rank B has y; ..."`` for every key whose values differ (missing keys included)."""
    parts = []
    for key in sorted(set(mine) | set(theirs)):
        if mine.get(key, "<missing>") != theirs.get(key, "<missing>"):
            parts.append(f"{key}: rank {my_rank} has {mine.get(key, '<missing>')!r}, "
                         f"rank {their_rank} has {theirs.get(key, '<missing>')!r}")
    return "; ".join(parts)


def _open_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _env_int("MASTER_PORT", None)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent already hosts the store
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # its store outlives restarts
        return dist.PrefixStore(f"attempt_{attempt}", dist.TCPStore(host, port, None, False, timeout))
    # No wait_for_workers: a rank started with the wrong world size must reach the check below.
    return dist.TCPStore(host, port, None, rank == 0, timeout, wait_for_workers=False, multi_tenant=True)


def _fetch_record(store: dist.Store, peer: int, my_rank: int, timeout_s: float) -> dict:
    key = f"{KEY_PREFIX}/{peer}"
    try:
        store.wait([key], timedelta(seconds=timeout_s))
        return json.loads(store.get(key))
    except RuntimeError as exc:
        raise StartupMismatch(
            f"dsahal.distributed: rank {my_rank} waited {timeout_s:g} s for rank {peer} to join and it did not "
            f"(was it started with a different world size, or has it failed?): {exc}") from exc


def check_same_start(store: dist.Store, rank: int, record: Mapping[str, Any], timeout_s: float) -> None:
    """The start-up check described in the module docstring; raises :class:`StartupMismatch`."""
    record = json.loads(json.dumps(dict(record), sort_keys=True, default=str))  # what peers will see
    store.set(f"{KEY_PREFIX}/{rank}", json.dumps(record, sort_keys=True))
    if rank != 0:
        theirs = _fetch_record(store, 0, rank, timeout_s)
        store.set(f"{KEY_PREFIX}/ack/{rank}", "1")
        diff = describe_differences(record, theirs, rank, 0)
        if diff:
            raise StartupMismatch(f"dsahal.distributed: rank {rank} was started differently from rank 0: {diff}")
        return
    for peer in range(1, int(record["world_size"])):
        theirs = _fetch_record(store, peer, rank, timeout_s)
        diff = describe_differences(record, theirs, rank, peer)
        if diff:
            _linger_for_ack(store, peer)
            raise StartupMismatch(f"dsahal.distributed: rank {peer} was started differently from rank 0: {diff}")


def _linger_for_ack(store: dist.Store, peer: int) -> None:
    """Rank 0 hosts the store; give a mismatched peer a moment to read rank 0's record and report too."""
    deadline = time.monotonic() + ACK_WAIT_S
    while time.monotonic() < deadline:
        if store.check([f"{KEY_PREFIX}/ack/{peer}"]):
            return
        time.sleep(0.05)


def init_distributed(fingerprint: Mapping[str, Any], *, backend: Optional[str] = None, timeout_s: float = 60.0,
                     rank: Optional[int] = None, world_size: Optional[int] = None) -> DistributedContext:
    """Join the process group described by the torchrun environment, after checking every rank agrees.

    Args:
        fingerprint: what every rank must agree on (model config, DCP size, formats, backend...), a flat
            JSON-able mapping; compared field by field.
        backend: ``"gloo"`` or ``"nccl"``; default NCCL when CUDA is available, else gloo.
        timeout_s: start-up wait and collective timeout: a peer that dies or stops answering makes
            every collective fail within this time instead of hanging.
        rank, world_size: override ``RANK`` / ``WORLD_SIZE`` (tests).

    Returns:
        A :class:`DistributedContext`; the default process group is initialised.
    """
    if dist.is_initialized():
        raise StartupMismatch("dsahal.distributed: init_distributed called twice (the process group exists)")
    rank = _env_int("RANK", None) if rank is None else rank
    world_size = _env_int("WORLD_SIZE", None) if world_size is None else world_size
    local_rank = _env_int("LOCAL_RANK", rank)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    store = _open_store(rank, world_size, timeout)
    check_same_start(store, rank, {"world_size": world_size, **fingerprint}, timeout_s)
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.PrefixStore("dsahal/pg", store), rank=rank,
                            world_size=world_size, timeout=timeout)
    set_configured_timeout(timeout_s)
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend,
                              timeout_s=timeout_s, device=device)


def shutdown_distributed() -> None:
    """Destroy the default process group if one exists."""
    if dist.is_initialized():
        dist.destroy_process_group()
    set_configured_timeout(None)
