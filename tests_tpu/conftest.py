"""Shared set-up of the TPU backend's tests: XLA's CPU client, the device, reference helpers.

These tests run only inside ``.venv-tpu`` (torch 2.9.0 + torch-xla 2.9.0) through
``scripts/test-tpu.sh``; the main suite in ``tests/`` never collects this folder.
"""
from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")  # before torch_xla starts a runtime

import pytest
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

import dsahal
from dsahal.registry import reset


@pytest.fixture(scope="session")
def xla() -> torch.device:
    return torch_xla.device()


@pytest.fixture(autouse=True)
def _fresh_registry():
    reset()
    yield
    reset()


def on_reference(fn, *args, **kwargs):
    """Run ``fn`` with the reference backend selected (on whatever device its tensors live)."""
    with dsahal.use_backend("reference"):
        return fn(*args, **kwargs)


def on_tpu(fn, *args, **kwargs):
    """Run ``fn`` with the TPU backend selected, then execute the pending XLA graph."""
    with dsahal.use_backend("tpu"):
        result = fn(*args, **kwargs)
    torch_xla.sync()
    return result


def host_fallback_counters() -> dict[str, int]:
    """torch-xla's counters of ATen ops it ran on the host instead of lowering (``aten::*``)."""
    return {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")}


def compile_count() -> int:
    """XLA compilations so far (torch-xla's ``UncachedCompile`` counter; a cache hit is not one)."""
    return int(met.counter_value("UncachedCompile") or 0)


def execute_count() -> int:
    """Graph executions so far (``ExecuteComputation``): one per ``torch_xla.sync()`` with work.
    Executions are asynchronous, so this waits for the device to finish first."""
    xm.wait_device_ops()
    return int(met.counter_value("ExecuteComputation") or 0)


def to(device, *tensors):
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in tensors]


def assert_close(got: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float, what: str) -> None:
    got, expected = got.cpu().double(), expected.cpu().double()
    assert got.shape == expected.shape, f"{what}: shape {list(got.shape)} != {list(expected.shape)}"
    same_inf = torch.equal(torch.isinf(got), torch.isinf(expected)) and torch.equal(
        got[torch.isinf(got)], expected[torch.isinf(expected)])
    assert same_inf, f"{what}: infinities differ"
    assert not torch.isnan(got).any(), f"{what}: NaN in the TPU result"
    finite = torch.isfinite(expected)
    error = (got[finite] - expected[finite]).abs()
    bound = atol + rtol * expected[finite].abs()
    assert bool((error <= bound).all()), f"{what}: max error {float((error - bound).max()):.3g} over the bound"
