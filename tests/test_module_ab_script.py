"""``scripts/h200/module_ab.py`` (a kernel module against a frozen copy of itself, on a CUDA machine): what a CPU
machine can check of it, the module swap and the bit comparison its verdicts rest on."""
from __future__ import annotations

import importlib
import os
import sys
import types

import pytest
import torch

HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def module_ab():
    sys.path.insert(0, os.path.join(HERE, "..", "scripts", "h200"))
    try:
        yield importlib.import_module("module_ab")
    finally:
        sys.path.pop(0)


def test_the_copy_is_what_the_package_resolves_while_swapped_and_only_then(module_ab):
    from dsahal.backends.triton_kernels import lse_combine as real

    copy = types.ModuleType("copy")
    with module_ab.swapped("lse_combine", copy):
        from dsahal.backends.triton_kernels import lse_combine as inside  # (as the backend's lazy imports do)

        assert inside is copy and sys.modules["dsahal.backends.triton_kernels.lse_combine"] is copy
    from dsahal.backends.triton_kernels import lse_combine as after

    assert after is real and sys.modules["dsahal.backends.triton_kernels.lse_combine"] is real


def test_a_swap_is_undone_when_the_call_inside_raises(module_ab):
    from dsahal.backends.triton_kernels import lse_combine as real

    with pytest.raises(RuntimeError):
        with module_ab.swapped("lse_combine", types.ModuleType("copy")):
            raise RuntimeError("the copy's launch failed")
    from dsahal.backends.triton_kernels import lse_combine as after

    assert after is real


def test_same_bits_tells_apart_what_compares_equal(module_ab):
    a = torch.tensor([0.0, 1.5, float("nan")])
    assert module_ab.same_bits(torch, a, a.clone())
    assert not module_ab.same_bits(torch, a, torch.tensor([-0.0, 1.5, float("nan")]))  # -0.0 == 0.0, not its bits
    assert not module_ab.same_bits(torch, a, a[:2])
    assert module_ab.same_bits(torch, (a, a[:1]), (a.clone(), a[:1].clone()))
    assert not module_ab.same_bits(torch, (a, a[:1]), (a.clone(), a[1:2].clone()))
