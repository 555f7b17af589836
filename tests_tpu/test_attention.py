"""Indexer, sparse MLA and the fused DSA layer on XLA against the reference, edge cases included:
unmapped blocks, -1 slots, rows with no valid slot, duplicated slots, garbage (NaN) bytes."""
from __future__ import annotations

import pytest
import torch

from dsahal import ops
from dsahal.formats import cache_format

from conftest import assert_close, on_reference, on_tpu, to

NUM_BLOCKS, BLOCK_TOKENS = 6, 8


def filled_pages(kind: str, fmt: str, seed: int, scale=None) -> torch.Tensor:
    """Pages whose every slot holds a packed random token, except block 0 (all 0xFF: NaN in every
    float format). Block 0 is never mapped below, but slot 0 is where a -1 slot's read lands."""
    spec = cache_format(kind, fmt)
    gen = torch.Generator().manual_seed(seed)
    pages = torch.zeros(NUM_BLOCKS, BLOCK_TOKENS, spec.token_bytes, dtype=torch.uint8)
    values = torch.randn(NUM_BLOCKS * BLOCK_TOKENS, spec.dim, generator=gen)
    slots = torch.arange(NUM_BLOCKS * BLOCK_TOKENS, dtype=torch.int32)
    on_reference(ops.cache_write, values, slots, pages, kind=kind, fmt=fmt, scale=scale)
    pages[0] = 0xFF
    return pages


def batch_metadata():
    block_table = torch.tensor([[2, 5, -1, 4], [1, 3, 5, -1]], dtype=torch.int32)  # -1: unmapped blocks
    req_ids = torch.tensor([0, 0, 1, 1, 1, 0], dtype=torch.int32)
    positions = torch.tensor([0, 21, 3, 17, 26, 31], dtype=torch.int32)
    return block_table, req_ids, positions


@pytest.mark.parametrize("fmt", ["fp8", "bf16", "mxfp4"])
def test_indexer_scores_match_the_reference_with_unmapped_blocks(fmt, xla):
    pages = filled_pages("index", fmt, seed=1)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(6, 4, 128, generator=gen)
    weights = torch.randn(6, 4, generator=gen)
    block_table, req_ids, positions = batch_metadata()
    args = (q, weights, pages, block_table, req_ids, positions)
    expected = on_reference(ops.indexer_score, *args, index_fmt=fmt, max_context=32)
    got = on_tpu(ops.indexer_score, *to(xla, *args), index_fmt=fmt, max_context=32)
    assert_close(got, expected, atol=1e-4, rtol=1e-5, what=f"indexer_score {fmt}")


def test_indexer_accepts_fp8_queries(xla):
    pages = filled_pages("index", "fp8", seed=3)
    gen = torch.Generator().manual_seed(4)
    q = (torch.randn(6, 4, 128, generator=gen) * 50).to(torch.float8_e4m3fn)
    weights = torch.rand(6, 4, generator=gen)
    block_table, req_ids, positions = batch_metadata()
    args = (q, weights, pages, block_table, req_ids, positions)
    expected = on_reference(ops.indexer_score, *args, index_fmt="fp8", max_context=40)
    got = on_tpu(ops.indexer_score, *to(xla, *args), index_fmt="fp8", max_context=40)
    assert_close(got, expected, atol=1e-3, rtol=1e-5, what="indexer_score fp8 q")


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8_ds_mla", "nvfp4"])
def test_sparse_mla_matches_the_reference_with_minus_one_empty_and_duplicate_slots(fmt, xla):
    scale = torch.tensor(0.01) if fmt == "fp8" else None
    pages = filled_pages("latent", fmt, seed=5, scale=scale)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(4, 3, 576, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([[13, 9, -1, 17, 30, -1],
                          [-1, -1, -1, -1, -1, -1],  # nothing to attend: o = 0, lse = -inf
                          [11, 11, 11, 12, 44, 47],  # a slot listed three times counts three times
                          [-1, 8, -1, -1, -1, 10]], dtype=torch.int32)
    args = (q, pages, slots)
    expected = on_reference(ops.sparse_mla, *args, kv_fmt=fmt, kv_scale=scale, softmax_scale=0.06)
    got = on_tpu(ops.sparse_mla, *to(xla, *args), kv_fmt=fmt, kv_scale=None if scale is None else scale.to(xla),
                 softmax_scale=0.06)
    assert got[0].dtype == torch.bfloat16
    assert_close(got[0], expected[0], atol=2e-2, rtol=2e-2, what=f"sparse_mla o {fmt}")
    assert_close(got[1], expected[1], atol=1e-4, rtol=1e-5, what=f"sparse_mla lse {fmt}")
    assert bool((got[0][1].cpu() == 0).all())


@pytest.mark.parametrize("index_fmt,kv_fmt", [("fp8", "bf16"), ("bf16", "fp8"), ("mxfp4", "nvfp4"), ("fp8", "fp8_ds_mla")])
def test_fused_dsa_attention_equals_the_reference_composition(index_fmt, kv_fmt, xla):
    kv_scale = torch.tensor(0.01) if kv_fmt == "fp8" else None
    index_pages = filled_pages("index", index_fmt, seed=7)
    kv_pages = filled_pages("latent", kv_fmt, seed=8, scale=kv_scale)
    gen = torch.Generator().manual_seed(9)
    q_index = torch.randn(6, 4, 128, generator=gen)
    weights = torch.randn(6, 4, generator=gen)
    q = torch.randn(6, 2, 576, generator=gen)
    block_table, req_ids, positions = batch_metadata()
    args = (q_index, weights, index_pages, q, kv_pages, block_table, req_ids, positions)
    kwargs = dict(index_fmt=index_fmt, kv_fmt=kv_fmt, topk=12, max_context=32, softmax_scale=0.05)
    expected = on_reference(ops.dsa_attention, *args, kv_scale=kv_scale, **kwargs)
    got = on_tpu(ops.dsa_attention, *to(xla, *args), kv_scale=None if kv_scale is None else kv_scale.to(xla),
                 **kwargs)
    assert_close(got[0], expected[0], atol=1e-4, rtol=1e-4, what="dsa_attention o")
    assert_close(got[1], expected[1], atol=1e-4, rtol=1e-5, what="dsa_attention lse")


def test_fused_dsa_attention_over_score_ranges_gives_the_one_range_result(xla, monkeypatch):
    """A layer whose scores pass the budget (lowered here to two 32-float rows) scores and selects over token ranges
    (dsahal.ops.score_ranges): bitwise the one-range result."""
    from dsahal.ops import score_ranges

    index_pages, kv_pages = filled_pages("index", "fp8", seed=7), filled_pages("latent", "bf16", seed=8)
    gen = torch.Generator().manual_seed(19)
    q_index, weights, q = (torch.randn(6, 4, 128, generator=gen), torch.randn(6, 4, generator=gen),
                           torch.randn(6, 2, 576, generator=gen))
    block_table, req_ids, positions = batch_metadata()
    args = to(xla, q_index, weights, index_pages, q, kv_pages, block_table, req_ids, positions)
    kwargs = dict(index_fmt="fp8", kv_fmt="bf16", kv_scale=None, topk=12, max_context=32, softmax_scale=0.05)
    whole = on_tpu(ops.dsa_attention, *args, **kwargs)
    monkeypatch.setattr(score_ranges, "SCORES_BUDGET_BYTES", 2 * 4 * 32)
    assert len(score_ranges.score_ranges(6, 32)) == 3
    ranged = on_tpu(ops.dsa_attention, *args, **kwargs)
    assert torch.equal(ranged[0].cpu(), whole[0].cpu()) and torch.equal(ranged[1].cpu(), whole[1].cpu())
