"""Where the TPU backend's ops run: on the XLA device, always.

XLA tensors (``torch_xla.device()``) are used in place: no copy, no host round trip, so a
serving loop keeps its whole step in one lazily traced graph.

Host (CPU) tensors are *staged*, a documented convenience for callers that build inputs on
the host (the conformance suite, tests, notebooks): they are copied to the XLA device, the op
runs there natively, outputs are copied back to the host, and an argument the op writes in
place (``cache_write``'s pages, the KDA state pool) is written back through the caller's
tensor with ``copy_`` (views included, so a page view of a packed pool updates the pool).
Each staged call costs a transfer and a graph execution; never use it on a hot path.

Anything else (a CUDA tensor, a mix of devices) is a ``ValueError`` naming the op and argument.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Iterable

import torch

STAGED_DEVICE_TYPES = ("cpu",)


def _to_host(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, tuple):
        return tuple(_to_host(v) for v in value)
    return value


def on_xla(op: str, mutated: Iterable[str] = ()) -> Callable[[Callable], Callable]:
    """Decorate an op implementation: run it on XLA tensors, staging host tensors (see module doc).

    ``mutated``: names of the arguments the op writes in place."""
    mutated = frozenset(mutated)

    def decorate(fn: Callable) -> Callable:
        names = list(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def run(*args):
            tensors = [(name, value) for name, value in zip(names, args) if isinstance(value, torch.Tensor)]
            kinds = {value.device.type for _, value in tensors}
            if kinds <= {"xla"}:
                return fn(*args)
            for name, value in tensors:
                if value.device.type not in ("xla", *STAGED_DEVICE_TYPES):
                    raise ValueError(
                        f"dsahal.{op}: argument '{name}' expected an XLA tensor (backend 'tpu' runs on "
                        f"torch_xla.device()) or a host tensor to stage, got device {value.device}")
            if len(kinds) > 1:
                listing = ", ".join(f"{name} on {value.device}" for name, value in tensors)
                raise ValueError(f"dsahal.{op}: expected all tensors on one device (XLA, or the host to stage), "
                                 f"got {listing}")
            import torch_xla

            device = torch_xla.device()
            staged = [value.to(device) if isinstance(value, torch.Tensor) else value for value in args]
            result = fn(*staged)
            for name, host, moved in zip(names, args, staged):
                if name in mutated:
                    host.copy_(moved.cpu())
            return _to_host(result)

        return run

    return decorate


def describe_device() -> str:
    """The XLA device this process would use, without initialising anything but XLA's CPU client.

    On ``PJRT_DEVICE=CPU`` the CPU client is started (cheap, local) and its devices listed. Any
    other PJRT device (TPU above all) is only named: starting libtpu from a listing command can
    hang on machines without a TPU, so the runtime is left for the first op to start."""
    import os

    device = os.environ.get("PJRT_DEVICE", "")
    if device.upper() != "CPU":
        return f"PJRT_DEVICE={device} (not initialised by the listing)"
    import torch_xla
    import torch_xla.runtime as xr

    devices = torch_xla.real_devices() if hasattr(torch_xla, "real_devices") else []
    return f"{torch_xla.device()} = XLA:CPU client, {xr.global_runtime_device_count()} device(s) {list(devices)}"
