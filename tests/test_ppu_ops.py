"""The PPU backend's portable ops agree with the reference on fresh random inputs and edge cases.

They run here on the CPU: the same torch code the PPU would run, not the PPU itself."""
import math

import pytest
import torch

import dsahal
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal import ops
from dsahal.backends.ppu import portable_attention, portable_index, portable_kda, verifiers
from dsahal.formats import INDEX_FORMATS, LATENT_FORMATS, cache_format
from dsahal.reference import cache as ref_cache
from dsahal.reference import indexer as ref_indexer
from dsahal.reference import kda as ref_kda
from dsahal.reference import lse_combine as ref_lse
from dsahal.reference import slots as ref_slots
from dsahal.reference import sparse_mla as ref_mla
from dsahal.reference import topk as ref_topk
from dsahal.registry import active_table

FEW = settings(max_examples=12, deadline=None)
NEG_INF = float("-inf")


def _filled_pages(kind, fmt, num_blocks, block_tokens, scale=None, seed=0):
    spec = cache_format(kind, fmt)
    pages = torch.zeros(num_blocks, block_tokens, spec.token_bytes, dtype=torch.uint8)
    values = torch.randn(num_blocks * block_tokens, spec.dim, generator=torch.Generator().manual_seed(seed))
    ref_cache.cache_write(values, torch.arange(num_blocks * block_tokens), pages, kind, fmt, scale)
    return pages


def _assert_close_with_same_infinities(actual, expected, rtol=1e-5):
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))
    finite = torch.isfinite(expected)
    if not finite.any():  # every entry -inf (a row of dead parts only): the infinities said it all
        return
    torch.testing.assert_close(actual[finite], expected[finite], rtol=rtol, atol=rtol * expected[finite].abs().max())


@FEW
@given(parts=st.integers(1, 4), tokens=st.integers(1, 5), dead=st.floats(0.0, 0.6), seed=st.integers(0, 2**16))
def test_lse_combine_matches_reference_including_dead_parts(parts, tokens, dead, seed):
    gen = torch.Generator().manual_seed(seed)
    o_parts = torch.randn(parts, tokens, 3, 16, generator=gen)
    lse_parts = 20 * torch.randn(parts, tokens, 3, generator=gen)  # spread wide: exp would overflow unshifted
    lse_parts[torch.rand(parts, tokens, 3, generator=gen) < dead] = NEG_INF
    o, lse = portable_attention.lse_combine(o_parts, lse_parts)
    o_ref, lse_ref = ref_lse.lse_combine(o_parts, lse_parts)
    _assert_close_with_same_infinities(lse, lse_ref)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-6)


def test_lse_combine_all_dead_row_gives_zero_and_minus_inf():
    o, lse = portable_attention.lse_combine(torch.randn(2, 1, 1, 4), torch.full((2, 1, 1), NEG_INF))
    assert torch.equal(o, torch.zeros(1, 1, 4)) and lse.item() == NEG_INF


@FEW
@given(tokens=st.integers(1, 6), width=st.integers(1, 48), k=st.integers(1, 60), levels=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_topk_returns_the_reference_set_under_the_tie_rule(tokens, width, k, levels, seed):
    gen = torch.Generator().manual_seed(seed)
    # Few distinct levels force ties straddling the k-th place; some -inf entries are never chosen.
    scores = torch.randint(0, levels, (tokens, width), generator=gen).float()
    scores[torch.rand(tokens, width, generator=gen) < 0.2] = NEG_INF
    lengths = torch.randint(0, width + 1, (tokens,), generator=gen).int()
    got = portable_index.topk(scores, lengths, k)
    want = ref_topk.topk(scores, lengths, k)
    assert got.shape == (tokens, k) and got.dtype == torch.int32
    assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]
    valid = got >= 0
    assert torch.equal(valid, valid.sort(dim=1, descending=True, stable=True).values)  # -1 padding last


@FEW
@given(tokens=st.integers(1, 5), picks=st.integers(1, 6), block_tokens=st.sampled_from([1, 4, 16]),
       seed=st.integers(0, 2**16))
def test_positions_to_slots_matches_reference_with_padding_and_unmapped_blocks(tokens, picks, block_tokens, seed):
    gen = torch.Generator().manual_seed(seed)
    block_table = torch.randint(-1, 9, (3, 4), generator=gen).int()
    positions = torch.randint(-1, 4 * block_tokens, (tokens, picks), generator=gen).int()
    req_ids = torch.randint(0, 3, (tokens,), generator=gen).int()
    assert torch.equal(portable_index.positions_to_slots(positions, req_ids, block_table, block_tokens),
                       ref_slots.positions_to_slots(positions, req_ids, block_table, block_tokens))


@pytest.mark.parametrize("fmt", sorted(INDEX_FORMATS))
def test_indexer_score_matches_reference_with_causality_and_unmapped_blocks(fmt):
    gen = torch.Generator().manual_seed(7)
    pages = _filled_pages("index", fmt, num_blocks=6, block_tokens=4, seed=1)
    block_table = torch.tensor([[2, 0, 5, 4], [1, -1, 3, -1]], dtype=torch.int32)
    req_ids = torch.tensor([0, 0, 1, 1, 0], dtype=torch.int32)
    positions = torch.tensor([0, 7, 11, 3, 14], dtype=torch.int32)
    q, weights = torch.randn(5, 4, 128, generator=gen), torch.randn(5, 4, generator=gen)
    args = (q, weights, pages, block_table, req_ids, positions, fmt, 12)  # max_context cuts position 14
    _assert_close_with_same_infinities(portable_index.indexer_score(*args), ref_indexer.indexer_score(*args))


def test_indexer_score_chunks_context_and_rows_without_changing_the_result(monkeypatch):
    pages = _filled_pages("index", "bf16", num_blocks=4, block_tokens=8, seed=2)
    block_table = torch.tensor([[3, 1, 0, 2]], dtype=torch.int32)
    q, weights = torch.randn(2, 2, 128), torch.randn(2, 2)
    args = (q, weights, pages, block_table, torch.zeros(2, dtype=torch.int32), torch.tensor([30, 17]), "bf16", 32)
    whole = portable_index.indexer_score(*args)
    monkeypatch.setattr(portable_index, "INDEXER_CONTEXT_CHUNK", 5)
    monkeypatch.setattr(portable_index, "INDEXER_MAX_LOGITS", 10)  # one row per step
    _assert_close_with_same_infinities(portable_index.indexer_score(*args), whole, rtol=1e-6)


@pytest.mark.parametrize("fmt", sorted(LATENT_FORMATS))
def test_sparse_mla_matches_reference_with_skipped_repeated_and_empty_rows(fmt):
    scale = torch.tensor(0.05) if LATENT_FORMATS[fmt].needs_tensor_scale else None
    pages = _filled_pages("latent", fmt, num_blocks=5, block_tokens=4, scale=scale, seed=3)
    q = torch.randn(4, 3, 576, generator=torch.Generator().manual_seed(4))
    slots = torch.tensor([[0, 5, 19, -1], [-1, -1, -1, -1], [3, 3, 7, 8], [12, -1, 1, -1]], dtype=torch.int32)
    o, lse = portable_attention.sparse_mla(q, pages, slots, fmt, scale, 0.07)
    o_ref, lse_ref = ref_mla.sparse_mla(q, pages, slots, fmt, scale, 0.07)
    _assert_close_with_same_infinities(lse, lse_ref)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(o[1], torch.zeros_like(o[1]))


@pytest.mark.parametrize("fmt", ["bf16", "fp8"])
def test_sparse_mla_ignores_whatever_bytes_sit_behind_skipped_slots(fmt):
    scale = torch.tensor(0.05) if LATENT_FORMATS[fmt].needs_tensor_scale else None
    pages = _filled_pages("latent", fmt, num_blocks=3, block_tokens=4, scale=scale, seed=6)
    pages[0] = 0xFF  # NaN in bf16 and in e4m3: never written, never selected
    q = torch.randn(2, 2, 576)
    slots = torch.tensor([[4, -1, 9, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    o, lse = portable_attention.sparse_mla(q, pages, slots, fmt, scale, 0.1)
    o_ref, lse_ref = ref_mla.sparse_mla(q, pages, slots, fmt, scale, 0.1)
    assert not torch.isnan(o).any()
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    _assert_close_with_same_infinities(lse, lse_ref)


def test_sparse_mla_gathers_in_row_groups_without_changing_the_result(monkeypatch):
    pages = _filled_pages("latent", "bf16", num_blocks=3, block_tokens=4, seed=5)
    q, slots = torch.randn(5, 2, 576), torch.randint(-1, 12, (5, 6)).int()
    whole = portable_attention.sparse_mla(q, pages, slots, "bf16", None, 0.1)
    monkeypatch.setattr(portable_attention, "SPARSE_MLA_GATHER_TOKENS", 7)  # one row per gather
    for got, want in zip(portable_attention.sparse_mla(q, pages, slots, "bf16", None, 0.1), whole):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def _kda_inputs(tokens, heads=2, key_dim=8, value_dim=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, heads, key_dim, generator=gen), torch.randn(tokens, heads, key_dim, generator=gen),
            torch.randn(tokens, heads, value_dim, generator=gen),
            -3 * torch.rand(tokens, heads, key_dim, generator=gen), torch.rand(tokens, heads, generator=gen))


@pytest.mark.parametrize("use_qk_l2norm", [True, False])
def test_kda_decode_matches_reference_and_skips_padding_requests(use_qk_l2norm):
    q, k, v, g, beta = _kda_inputs(4, seed=1)
    pool = torch.randn(5, 2, 8, 6)
    ref_pool = pool.clone()
    state_ids = torch.tensor([3, -1, 0, 1], dtype=torch.int32)
    out = portable_kda.kda_decode(q, k, v, g, beta, pool, state_ids, 0.3, use_qk_l2norm)
    ref_out = ref_kda.kda_decode(q, k, v, g, beta, ref_pool, state_ids, 0.3, use_qk_l2norm)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("use_qk_l2norm", [True, False])
def test_kda_prefill_matches_reference_across_chunks_empty_and_stateless_sequences(use_qk_l2norm):
    q, k, v, g, beta = _kda_inputs(150, seed=2)
    cu_seqlens = torch.tensor([0, 70, 70, 150], dtype=torch.int32)  # 70 spans two chunks; one sequence empty
    state_ids = torch.tensor([2, 4, -1], dtype=torch.int32)
    pool = torch.randn(5, 2, 8, 6)
    ref_pool = pool.clone()
    out = portable_kda.kda_prefill(q, k, v, g, beta, cu_seqlens, pool, state_ids, 0.3, use_qk_l2norm)
    ref_out = ref_kda.kda_prefill(q, k, v, g, beta, cu_seqlens, ref_pool, state_ids, 0.3, use_qk_l2norm)
    scale = ref_out.abs().max()
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5 * scale)
    torch.testing.assert_close(pool, ref_pool, rtol=1e-4, atol=1e-5)


def test_kda_prefill_takes_a_minus_inf_gate_as_the_reference_does():
    """A -inf gate (a full reset of its channel, as in a decode step) gives the reference's output and state, no NaN."""
    q, k, v, g, beta = _kda_inputs(150, seed=4)
    g[5, 1, :3] = float("-inf")
    g[100, 0, 0] = float("-inf")
    cu_seqlens = torch.tensor([0, 150], dtype=torch.int32)
    state_ids = torch.tensor([1], dtype=torch.int32)
    pool = torch.randn(2, 2, 8, 6)
    ref_pool = pool.clone()
    out = portable_kda.kda_prefill(q, k, v, g, beta, cu_seqlens, pool, state_ids, 0.3, False)
    ref_out = ref_kda.kda_prefill(q, k, v, g, beta, cu_seqlens, ref_pool, state_ids, 0.3, False)
    assert not out.isnan().any() and not pool.isnan().any()
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5 * ref_out.abs().max())
    torch.testing.assert_close(pool, ref_pool, rtol=1e-4, atol=1e-5)


def test_verifiers_read_shapes_only_and_state_the_limit():
    wide = torch.empty((1, 1 << 24), device="meta")
    ok, reason = verifiers.portable_topk(wide, torch.empty((1,), dtype=torch.int32, device="meta"), 8)
    assert not ok and "2^24" in reason
    assert verifiers.portable_topk(torch.empty((1, 100), device="meta"), None, 8) == (True, "")
    slots = torch.empty((1, verifiers.SPARSE_MLA_MAX_SLOTS_PER_ROW + 1), dtype=torch.int32, device="meta")
    ok, reason = verifiers.portable_sparse_mla(None, None, slots, "bf16", None, 0.1)
    assert not ok and "1 GiB" in reason


def test_cpu_twin_serves_the_ppu_ops_natively_through_the_op_interface(monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "dsahal.backends.ppu.cpu_twin")
    monkeypatch.setenv("DSAHAL_BACKEND", "ppu-cpu-twin")
    o_parts, lse_parts = torch.randn(3, 2, 2, 8), torch.randn(3, 2, 2)
    with dsahal.observe(dsahal.CallLog()) as log:
        o, lse = ops.lse_combine(o_parts, lse_parts)
    table = active_table()
    assert table.name == "ppu-cpu-twin" and [(c.route, c.fallback) for c in log.calls] == [("portable", False)]
    assert table.entries["cache_write"].status == "fallback"
    torch.testing.assert_close(o, ref_lse.lse_combine(o_parts, lse_parts)[0])


@pytest.mark.parametrize("log2_scale", [10, 20, 23, 30])
def test_sparse_mla_is_normalised_at_large_logits(log2_scale):
    """Two slots with equal, exactly representable logits near -2^k: o is their average at any magnitude (the
    weights were exp(logit - lse) against an fp32-rounded lse, which summed to 1.2-2 from logits near 2^23)."""
    latent = torch.randn(16, 576, generator=torch.Generator().manual_seed(3))
    latent[:, 0] = -1.0  # q = e_0: every logit is -softmax_scale exactly
    pages = cache_format("latent", "bf16").pack(latent, None).view(1, 16, -1)
    q = torch.zeros(1, 1, 576)
    q[0, 0, 0] = 1.0
    slots = torch.tensor([[3, 5]], dtype=torch.int32)
    o, lse = portable_attention.sparse_mla(q, pages, slots, "bf16", None, 2.0 ** log2_scale)
    stored = cache_format("latent", "bf16").unpack(pages.view(16, -1)[[3, 5]]).double()
    torch.testing.assert_close(o[0, 0].double(), stored[:, :512].mean(0), rtol=1e-6, atol=1e-6)
    assert lse[0, 0].item() == pytest.approx(-(2.0 ** log2_scale) + math.log(2), rel=1e-6)


def test_sparse_mla_of_no_slot_is_empty_attention():
    """A slot list of width 0 (the op accepts it): o 0 and lse -inf on every row, as the reference."""
    pages = cache_format("latent", "bf16").pack(torch.randn(16, 576), None).view(1, 16, -1)
    o, lse = portable_attention.sparse_mla(torch.randn(2, 3, 576), pages, torch.zeros(2, 0, dtype=torch.int32),
                                           "bf16", None, 0.1)
    assert torch.equal(o, torch.zeros(2, 3, 512)) and bool(torch.isneginf(lse).all())
