"""Models built on the meta device without torch's default parameter initialisation.

``with torch.device("meta")`` alone still runs every module's ``reset_parameters``: ``nn.Embedding``'s
``init.normal_`` on a meta tensor goes through ``torch._refs``, whose first use imports ``torch._dynamo``
(and with it sympy and ``torch.distributed.fsdp``): 3-5 s of a first ``dsahal run`` on an H200 host
(cProfile, 2026-12-01), for fills of tensors that have no storage and are overwritten anyway (weights are
drawn or loaded after the model is given storage). Inside :func:`on_meta` torch.nn.init's fills return their
tensor untouched, as Hugging Face's ``no_init_weights`` does. Nothing else changes: shapes, dtypes and module
structure are the modules' own. ``Module.to_empty`` has the same trap (``empty_like`` of a meta tensor is
``torch._refs.empty_like``, which imports sympy through ``symbolic_shapes``): :func:`materialize` gives the
parameters and buffers storage with plain ``torch.empty`` of their shapes.
"""
from __future__ import annotations

import contextlib
import threading

import torch

# every in-place fill torch.nn.init offers (the modules' reset_parameters call these through ``init.``)
_FILLS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
          "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")
_lock = threading.Lock()  # the patch is process-wide: one builder at a time


def _skipped_on_meta(fill):
    """``fill``, except that a meta tensor is returned untouched: the patch is process-wide, and another
    thread initialising a real module meanwhile must still get its values."""
    def fill_unless_meta(tensor, *args, **kwargs):
        return tensor if tensor.is_meta else fill(tensor, *args, **kwargs)
    return fill_unless_meta


@contextlib.contextmanager
def on_meta():
    """``torch.device("meta")`` with torch.nn.init's fills skipped on meta tensors (module docstring)."""
    with _lock:
        saved = {name: getattr(torch.nn.init, name) for name in _FILLS if hasattr(torch.nn.init, name)}
        try:
            for name, fill in saved.items():
                setattr(torch.nn.init, name, _skipped_on_meta(fill))
            with torch.device("meta"):
                yield
        finally:
            for name, fn in saved.items():
                setattr(torch.nn.init, name, fn)


def materialize(model: torch.nn.Module, device) -> torch.nn.Module:
    """``model.to_empty(device=device)`` without ``empty_like`` (module docstring): every parameter and buffer
    of a meta-device model replaced by an uninitialised tensor of its shape and dtype on ``device``; returns
    ``model``. A parameter or buffer shared between modules stays shared."""
    device = torch.device(device)
    made: dict[int, torch.Tensor] = {}
    originals = []  # kept alive until the end, so no id() is reused by a new object meanwhile
    with torch.no_grad():
        for module in model.modules():
            for name, param in list(module.named_parameters(recurse=False)):
                if id(param) not in made:
                    originals.append(param)
                    made[id(param)] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device=device),
                                                         requires_grad=param.requires_grad)
                setattr(module, name, made[id(param)])
            for name, buffer in list(module.named_buffers(recurse=False)):
                if id(buffer) not in made:
                    originals.append(buffer)
                    made[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
                setattr(module, name, made[id(buffer)])
    return model
