"""Calls on an empty cache (pages of 0 blocks, every slot and block-table entry -1: all the checks allow there) get
the contract's result from the op itself, with no route asked (``dsahal.ops._empty``): FlashMLA's sparse decode
kernel read past such a cache on an H100 (forty-first session), so no backend's kernel is trusted with one."""
import pytest
import torch

from dsahal import ops, use_backend
from dsahal.formats import index_format, latent_format
from dsahal.registry.observers import CallLog, observe

I32 = torch.int32


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8_ds_mla", "nvfp4"])
def test_sparse_mla_on_an_empty_cache_is_zero_and_minus_inf_without_a_route(fmt):
    spec = latent_format(fmt)
    pages = torch.empty((0, 64, spec.token_bytes), dtype=torch.uint8)
    scale = torch.tensor(0.5) if spec.needs_tensor_scale else None
    q = torch.randn(3, 5, 576).to(torch.bfloat16)
    with use_backend("reference"), observe(CallLog()) as log:
        o, lse = ops.sparse_mla(q, pages, torch.full((3, 7), -1, dtype=I32), kv_fmt=fmt, kv_scale=scale,
                                softmax_scale=0.1)
    assert log.calls == []
    assert o.shape == (3, 5, 512) and o.dtype == torch.bfloat16 and not o.any()
    assert lse.shape == (3, 5) and lse.dtype == torch.float32 and bool((lse == float("-inf")).all())
    with pytest.raises(ValueError, match="sparse_mla: argument 'slots' expected values in \\[-1, -1\\]"):
        ops.sparse_mla(q, pages, torch.zeros((3, 7), dtype=I32), kv_fmt=fmt, kv_scale=scale, softmax_scale=0.1)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "mxfp4"])
def test_indexer_and_dsa_layer_on_an_empty_cache_answer_without_a_route(fmt):
    index_pages = torch.empty((0, 16, index_format(fmt).token_bytes), dtype=torch.uint8)
    kv_pages = torch.empty((0, 16, latent_format("bf16").token_bytes), dtype=torch.uint8)
    table = torch.full((2, 4), -1, dtype=I32)
    req, pos = torch.tensor([0, 0, 1], dtype=I32), torch.tensor([3, 9, 60], dtype=I32)
    q_index, weights = torch.randn(3, 4, 128), torch.rand(3, 4)
    q = torch.randn(3, 2, 576)
    with use_backend("reference"), observe(CallLog()) as log:
        scores = ops.indexer_score(q_index, weights, index_pages, table, req, pos, index_fmt=fmt, max_context=64)
        o, lse = ops.dsa_attention(q_index, weights, index_pages, q, kv_pages, table, req, pos, index_fmt=fmt,
                                   kv_fmt="bf16", topk=8, max_context=64, softmax_scale=0.1)
    assert log.calls == []
    assert scores.shape == (3, 64) and bool((scores == float("-inf")).all())
    assert o.shape == (3, 2, 512) and not o.any() and bool((lse == float("-inf")).all())
    # the same answers as the reference's own route on a cache whose every block is unmapped
    pages_one = torch.zeros((1, 16, index_format(fmt).token_bytes), dtype=torch.uint8)
    with use_backend("reference"):
        unmapped = ops.indexer_score(q_index, weights, pages_one, table, req, pos, index_fmt=fmt, max_context=64)
    assert torch.equal(unmapped, scores)
