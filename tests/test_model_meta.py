"""Meta-device model building without torch's default init and without ``empty_like`` (core/model/meta.py)."""
import subprocess
import sys
import textwrap

import torch

from dsahal.config import load_config
from dsahal.model import HybridModel
from dsahal.model.meta import materialize, on_meta


def test_on_meta_skips_init_and_restores_it():
    before = torch.nn.init.normal_
    with on_meta():
        assert torch.nn.init.normal_ is not before
        layer = torch.nn.Linear(4, 3)
    assert torch.nn.init.normal_ is before
    assert layer.weight.is_meta
    fresh = torch.nn.Linear(4, 3)  # outside: init runs again
    assert not fresh.weight.is_meta and bool(fresh.weight.abs().sum() > 0)


def test_on_meta_still_fills_real_tensors():
    """The patch is process-wide: a real tensor filled meanwhile (another thread's module) gets its values."""
    real = torch.zeros(64)
    with on_meta():
        torch.nn.init.normal_(real)
        ones = torch.nn.init.ones_(torch.empty(3, device="cpu"))
    assert bool(real.abs().sum() > 0) and torch.equal(ones, torch.ones(3))


def test_materialize_keeps_shapes_dtypes_sharing_and_grad_flags():
    with on_meta():
        model = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Linear(6, 10, bias=False),
                                    torch.nn.BatchNorm1d(10))
    model[1].weight = model[0].weight  # tied, as an LM head tied to its embedding
    model[2].weight.requires_grad_(False)
    shapes = {n: (tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()}
    buffers = {n: (tuple(b.shape), b.dtype) for n, b in model.named_buffers()}
    materialize(model, "cpu")
    assert {n: (tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()} == shapes
    assert {n: (tuple(b.shape), b.dtype) for n, b in model.named_buffers()} == buffers
    assert all(not p.is_meta for p in model.parameters()) and all(not b.is_meta for b in model.buffers())
    assert model[1].weight is model[0].weight
    assert model[2].running_mean.dtype == torch.float32 and model[2].num_batches_tracked.dtype == torch.int64


def test_the_model_builds_like_to_empty():
    config = load_config("tiny")
    with on_meta():
        ours = HybridModel(config).to(torch.bfloat16)
    with torch.device("meta"):
        theirs = HybridModel(config).to(torch.bfloat16)
    materialize(ours, "cpu")
    theirs = theirs.to_empty(device="cpu")
    assert [(n, tuple(p.shape), p.dtype) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape), p.dtype) for n, p in theirs.named_parameters()]
    assert [(n, tuple(b.shape), b.dtype) for n, b in ours.named_buffers()] == \
        [(n, tuple(b.shape), b.dtype) for n, b in theirs.named_buffers()]


def test_building_the_model_imports_no_dynamo_or_sympy():
    """The reason for the module: on an H200 host these imports cost 3-5 s of a first run."""
    code = textwrap.dedent("""
        import sys, torch
        from dsahal.config import load_config
        from dsahal.model import HybridModel
        from dsahal.model.meta import materialize, on_meta
        with on_meta():
            model = HybridModel(load_config("tiny")).to(torch.bfloat16)
        materialize(model, "cpu")
        heavy = [m for m in ("torch._dynamo", "sympy", "torch.distributed.fsdp") if m in sys.modules]
        print(",".join(heavy))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"building the model imported {out.stdout.strip()}"
