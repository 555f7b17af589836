"""The Gluon few-heads sparse MLA kernel (:mod:`dsahal.backends.triton_kernels.sparse_mla_gluon`) on a CPU machine.

Gluon has no interpreter, so its results are checked on the H200 only (``scripts/h200/gluon_check.py`` against the
float64 reference on the edge cases, ``scripts/h200/small_heads_sweep.py`` at the serving shape, the conformance
suite through the route). Here: what the launcher serves and refuses (with the op, the argument, what was expected and
what was given), and that the kernel compiles for sm_90 with the local Triton (its Gluon API moved between releases:
the compile catches a name that no longer exists) without spilling.
"""
from __future__ import annotations

import pytest
import torch

from dsahal.backends.triton_kernels import sparse_mla_gluon as g


def _pages(blocks=4, block_tokens=16, device="cpu"):
    return torch.zeros(blocks, block_tokens, 656, dtype=torch.uint8, device=device)


def test_serves_bf16_queries_of_at_most_16_heads_on_aligned_fp8_ds_mla_pages_on_a_cuda_device_only():
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    assert not g.serves(q, _pages(), "fp8_ds_mla")  # a CPU tensor: no GPU to run Gluon on
    meta_q = torch.empty(2, 16, 576, dtype=torch.bfloat16, device="meta")
    meta_pages = _pages(device="meta")
    assert not g.serves(meta_q, meta_pages, "fp8_ds_mla")  # not CUDA either
    assert not g.serves(q, _pages(), "nvfp4")
    assert not g.serves(q.float(), _pages(), "fp8_ds_mla")
    assert not g.serves(torch.zeros(2, 17, 576, dtype=torch.bfloat16), _pages(), "fp8_ds_mla")


def test_a_call_it_does_not_serve_raises_naming_the_op_and_what_it_got():
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    slots = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"triton sparse_mla_gluon: expected bf16 q .* got q torch.bfloat16 "
                                         r"\[2, 16, 576\] on cpu"):
        g.sparse_mla_gluon(q, _pages(), slots, "fp8_ds_mla", None, 0.1)


@pytest.mark.parametrize("kwargs, message", [(dict(block_n=8), "block_n expected a power of two >= 16, got 8"),
                                             (dict(block_n=128), "block_n expected 16, 32 or 64, got 128"),
                                             (dict(stages=1), "stages expected 2..4, got 1"),
                                             (dict(split_size=0), "split_size expected None or >= 1, got 0")])
def test_launch_parameters_are_checked_before_any_launch(monkeypatch, kwargs, message):
    monkeypatch.setattr(g, "refusal", lambda *args: "")  # past the device check: the parameters' own
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=f"triton sparse_mla_gluon: {message}"):
        g.sparse_mla_gluon(q, _pages(), torch.zeros(2, 8, dtype=torch.int32), "fp8_ds_mla", None, 0.1, **kwargs)


def test_the_kernel_compiles_for_hopper_without_spilling():
    from dsahal.backends.nvidia import aot

    (variant,) = aot._gluon_variants()
    result = aot.compile_variant(variant)
    assert result.error == "", result.error
    assert 0 < result.registers <= 255 and result.stack_bytes == 0
    assert 0 < result.shared_bytes <= 227 * 1024  # an H200 SM's shared memory for one program


def test_the_route_verifier_names_what_the_gluon_kernel_does_not_take():
    from dsahal.backends.nvidia.verifiers import gluon_few_heads_accepts

    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    slots = torch.zeros(2, 8, dtype=torch.int32)
    cases = [((q, _pages(), slots, "nvfp4"), "nvfp4 latents: the Gluon kernel reads fp8_ds_mla records"),
             ((torch.zeros(2, 17, 576, dtype=torch.bfloat16), _pages(), slots, "fp8_ds_mla"),
              r"q of shape \[2, 17, 576\]: the Gluon kernel takes \[T, <= 16, 576\]"),
             ((q.float(), _pages(), slots, "fp8_ds_mla"), "float32 queries: the Gluon kernel takes bf16"),
             ((q, _pages(), slots, "fp8_ds_mla"), "the Gluon kernel runs on NVIDIA CUDA tensors only")]
    for (qq, pages, ss, fmt), why in cases:
        ok, reason = gluon_few_heads_accepts(qq, pages, ss, fmt, None, 0.1)
        assert not ok
        assert __import__("re").fullmatch(why, reason), reason
