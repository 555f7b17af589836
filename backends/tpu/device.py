"""The TPU backend runs on XLA tensors only, and says so clearly when given anything else.

Choice: tensors that arrive on another device (CPU, CUDA) are rejected with a ``ValueError``
naming the op and the argument, never moved silently. Moving would hide a host-device copy
per call, and for the ops that write in place (``cache_write`` pages, KDA state pools) the
write would land in a copy the caller never sees. Move inputs once with
``tensor.to(torch_xla.device())``.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch


def require_xla(op: str) -> Callable[[Callable], Callable]:
    """Decorate an op implementation: every tensor argument must live on an XLA device."""

    def decorate(fn: Callable) -> Callable:
        names = list(inspect.signature(fn).parameters)

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            for name, value in list(zip(names, args)) + list(kwargs.items()):
                if isinstance(value, torch.Tensor) and value.device.type != "xla":
                    raise ValueError(
                        f"dsahal.{op}: argument '{name}' expected an XLA tensor (backend 'tpu' runs on "
                        f"torch_xla.device(); move inputs with .to(torch_xla.device())), got device {value.device}"
                    )
            return fn(*args, **kwargs)

        return checked

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
