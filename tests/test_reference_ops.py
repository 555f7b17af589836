"""Each reference op against an independent float64 formulation on random inputs."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal import ops
from dsahal.formats import index_format, latent_format
from dsahal.reference.kda import kda_recurrent_sequence

SETTINGS = settings(max_examples=12, deadline=None)


def _paged_cache(num_blocks, block_tokens, kind, fmt, seed):
    """A cache filled with random tokens in every slot; returns (pages, dequantised values [slots, D])."""
    gen = torch.Generator().manual_seed(seed)
    spec = latent_format(fmt) if kind == "latent" else index_format(fmt)
    values = torch.randn(num_blocks * block_tokens, spec.dim, generator=gen)
    pages = torch.zeros(num_blocks, block_tokens, spec.token_bytes, dtype=torch.uint8)
    scale = torch.tensor(0.05) if spec.needs_tensor_scale else None
    ops.cache_write(values, torch.arange(values.shape[0]), pages, kind=kind, fmt=fmt, scale=scale)
    return pages, spec.unpack(pages.reshape(-1, spec.token_bytes), scale).double(), scale


@SETTINGS
@given(seed=st.integers(0, 2**16), tokens=st.integers(1, 6), heads=st.integers(1, 4),
       block_tokens=st.sampled_from([4, 16]), fmt=st.sampled_from(["bf16", "fp8"]))
def test_indexer_score_matches_dense_masked_formulation(seed, tokens, heads, block_tokens, fmt):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = 6
    pages, keys, _ = _paged_cache(num_blocks, block_tokens, "index", fmt, seed)
    block_table = torch.randperm(num_blocks, generator=gen)[:4].int().reshape(2, 2)
    req_ids = torch.randint(0, 2, (tokens,), generator=gen).int()
    positions = torch.randint(0, 2 * block_tokens, (tokens,), generator=gen).int()
    q = torch.randn(tokens, heads, 128, generator=gen)
    weights = torch.rand(tokens, heads, generator=gen)
    width = 2 * block_tokens + 3
    scores = ops.indexer_score(q, weights, pages, block_table, req_ids, positions, index_fmt=fmt, max_context=width)
    # Dense: every request's keys as one matrix, all heads at once, mask afterwards.
    logical = torch.arange(2 * block_tokens)
    slots = block_table.long()[:, logical // block_tokens] * block_tokens + logical % block_tokens  # [2, S]
    per_request_keys = keys[slots]  # [2, S, 128]
    logits = torch.einsum("thd,tsd->ths", q.double(), per_request_keys[req_ids.long()])
    dense = torch.einsum("th,ths->ts", weights.double(), logits.clamp_min(0))
    expected = torch.full((tokens, width), -math.inf, dtype=torch.float64)
    visible = logical[None, :] <= positions[:, None]
    expected[:, : 2 * block_tokens] = torch.where(visible, dense, torch.tensor(-math.inf, dtype=torch.float64))
    assert torch.equal(torch.isinf(scores), torch.isinf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(scores[finite].double(), expected[finite], rtol=1e-5, atol=1e-4)


@SETTINGS
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 5), width=st.integers(1, 40), k=st.integers(1, 48),
       levels=st.integers(1, 6))
def test_topk_matches_python_sort_with_tie_rule(seed, rows, width, k, levels):
    gen = torch.Generator().manual_seed(seed)
    # Few distinct levels force ties; some -inf entries must never be chosen.
    scores = torch.randint(0, levels, (rows, width), generator=gen).float()
    scores[torch.rand(rows, width, generator=gen) < 0.2] = -math.inf
    lengths = torch.randint(0, width + 1, (rows,), generator=gen).int()
    got = ops.topk(scores, lengths, k)
    assert got.shape == (rows, k) and got.dtype == torch.int32
    for r in range(rows):
        candidates = [(-scores[r, i].item(), i) for i in range(int(lengths[r])) if scores[r, i] != -math.inf]
        expected = [i for _, i in sorted(candidates)[:k]]
        expected += [-1] * (k - len(expected))
        assert got[r].tolist() == expected


@SETTINGS
@given(seed=st.integers(0, 2**16), tokens=st.integers(1, 4), heads=st.integers(1, 3), chosen=st.integers(0, 12),
       fmt=st.sampled_from(["bf16", "fp8"]))
def test_sparse_mla_matches_dense_attention_with_multiplicity(seed, tokens, heads, chosen, fmt):
    gen = torch.Generator().manual_seed(seed)
    pages, kv, scale = _paged_cache(4, 8, "latent", fmt, seed)
    q = torch.randn(tokens, heads, 576, generator=gen)
    slots = torch.randint(-1, 32, (tokens, chosen), generator=gen).int()
    softmax_scale = 0.07
    o, lse = ops.sparse_mla(q, pages, slots, kv_fmt=fmt, softmax_scale=softmax_scale, kv_scale=scale)
    # Dense over all 32 slots, each weighted by how often it was chosen (log-count bias).
    counts = torch.zeros(tokens, 32, dtype=torch.float64)
    for t in range(tokens):
        for s in slots[t].tolist():
            if s >= 0:
                counts[t, s] += 1
    logits = softmax_scale * torch.einsum("thd,sd->ths", q.double(), kv) + torch.log(counts)[:, None, :]
    expected_lse = torch.logsumexp(logits, dim=-1)
    probs = torch.nan_to_num(torch.softmax(logits, dim=-1), nan=0.0)
    expected_o = torch.einsum("ths,sd->thd", probs, kv[:, :512])
    torch.testing.assert_close(lse.double(), expected_lse.float().double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o.double(), expected_o, rtol=1e-4, atol=1e-5)


def test_sparse_mla_empty_row_gives_zero_output_and_minus_inf_lse():
    pages, _, _ = _paged_cache(2, 4, "latent", "bf16", 0)
    o, lse = ops.sparse_mla(torch.randn(2, 3, 576), pages, torch.full((2, 5), -1, dtype=torch.int32),
                            kv_fmt="bf16", softmax_scale=0.1)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.isneginf(lse).all()


@SETTINGS
@given(seed=st.integers(0, 2**16), parts=st.integers(1, 4), tokens=st.integers(1, 4))
def test_lse_combine_matches_max_shifted_formula(seed, parts, tokens):
    gen = torch.Generator().manual_seed(seed)
    o_parts = torch.randn(parts, tokens, 2, 16, generator=gen)
    lse_parts = 30 * torch.randn(parts, tokens, 2, generator=gen)
    lse_parts[torch.rand(parts, tokens, 2, generator=gen) < 0.3] = -math.inf
    o, lse = ops.lse_combine(o_parts, lse_parts)
    for t in range(tokens):
        for h in range(2):
            values = [x for x in lse_parts[:, t, h].double().tolist() if x != -math.inf]
            if not values:
                assert lse[t, h] == -math.inf and torch.all(o[t, h] == 0)
                continue
            peak = max(values)
            total = sum(math.exp(x - peak) for x in values)
            assert lse[t, h].item() == pytest.approx(peak + math.log(total), rel=1e-6, abs=1e-5)
            expected = sum(math.exp(lse_parts[r, t, h].item() - peak) / total * o_parts[r, t, h].double()
                           for r in range(parts) if lse_parts[r, t, h] != -math.inf)
            torch.testing.assert_close(o[t, h].double(), expected, rtol=1e-5, atol=1e-6)


def _kda_inputs(gen, length, heads, key_dim, value_dim):
    q = torch.randn(length, heads, key_dim, generator=gen)
    k = torch.randn(length, heads, key_dim, generator=gen)
    v = torch.randn(length, heads, value_dim, generator=gen)
    g = -torch.rand(length, heads, key_dim, generator=gen) * 2  # decays, some strong
    beta = torch.rand(length, heads, generator=gen)
    return q, k, v, g, beta


def _kda_matrix_form(q, k, v, g, beta, state, scale):
    """S_t = (I − β k kᵀ) diag(e^g) S + β k vᵀ, o_t = S_tᵀ q scale: the recurrence as explicit matrices."""
    q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q.double(), k.double()))
    state = state.double().clone()
    outputs = []
    for t in range(q.shape[0]):
        step = []
        for h in range(q.shape[1]):
            kh = k[t, h][:, None]
            eye = torch.eye(kh.shape[0], dtype=torch.float64)
            new = (eye - beta[t, h] * kh @ kh.T) @ torch.diag(torch.exp(g[t, h].double())) @ state[h]
            state[h] = new + beta[t, h] * kh @ v[t, h].double()[None, :]
            step.append(state[h].T @ (scale * q[t, h]))
        outputs.append(torch.stack(step))
    return state, torch.stack(outputs) if outputs else torch.zeros(0)


@SETTINGS
@given(seed=st.integers(0, 2**16), lengths=st.lists(st.integers(0, 70), min_size=1, max_size=3))
def test_kda_prefill_matches_explicit_matrix_recurrence(seed, lengths):
    gen = torch.Generator().manual_seed(seed)
    heads, key_dim, value_dim = 2, 8, 4
    total = sum(lengths)
    q, k, v, g, beta = _kda_inputs(gen, total, heads, key_dim, value_dim)
    pool = torch.randn(len(lengths) + 1, heads, key_dim, value_dim, generator=gen)
    initial = pool.clone()
    state_ids = torch.arange(1, len(lengths) + 1).int()
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
    out = ops.kda_prefill(q, k, v, g, beta, cu, pool, state_ids)
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        state, expected = _kda_matrix_form(q[start:end], k[start:end], v[start:end], g[start:end],
                                           beta[start:end], initial[b + 1], key_dim**-0.5)
        if end > start:
            torch.testing.assert_close(out[start:end].double(), expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(pool[b + 1].double(), state, rtol=1e-4, atol=1e-4)
    assert torch.equal(pool[0], initial[0])  # an unused state is untouched


def test_kda_decode_matches_matrix_form_and_skips_padding():
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta = _kda_inputs(gen, 3, 2, 8, 4)  # 3 requests, one token each
    pool = torch.randn(4, 2, 8, 4, generator=gen)
    initial = pool.clone()
    state_ids = torch.tensor([2, -1, 0], dtype=torch.int32)
    out = ops.kda_decode(q, k, v, g, beta, pool, state_ids)
    for b, sid in ((0, 2), (2, 0)):
        state, expected = _kda_matrix_form(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1],
                                           initial[sid], 8**-0.5)
        torch.testing.assert_close(out[b].double(), expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool[sid].double(), state, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(pool[1], initial[1]) and torch.equal(pool[3], initial[3])


def test_kda_chunked_equals_recurrent_definition_across_chunk_boundaries():
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta = _kda_inputs(gen, 150, 2, 16, 8)
    pool = torch.zeros(1, 2, 16, 8)
    out = ops.kda_prefill(q, k, v, g, beta, torch.tensor([0, 150], dtype=torch.int32), pool,
                          torch.tensor([0], dtype=torch.int32), use_qk_l2norm=False, scale=0.3)
    state, expected = kda_recurrent_sequence(q, k, v, g, beta, torch.zeros(2, 16, 8), 0.3, False)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[0].double(), state, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("gate", [float("-inf"), -1e300, -800.0])
def test_kda_prefill_takes_a_full_reset_gate_as_decode_steps_do(gate):
    """A gate whose exponential is 0 (-inf, or finite and that strong) resets its channel: the chunked prefill gives
    the token-by-token definition's output and state, with no NaN (the pairwise differences once made -inf - -inf)."""
    gen = torch.Generator().manual_seed(11)
    q, k, v, g, beta = _kda_inputs(gen, 150, 2, 16, 8)
    g = g.double()  # (the op takes any float gate: -1e300 stays finite)
    g[3, 0, :5] = gate  # early in the first chunk, and twice in the second (the same channel)
    g[70, 1, 2] = gate
    g[90, 1, 2] = gate
    initial = torch.randn(1, 2, 16, 8, generator=gen)
    pool = initial.clone()
    out = ops.kda_prefill(q, k, v, g, beta, torch.tensor([0, 150], dtype=torch.int32), pool,
                          torch.tensor([0], dtype=torch.int32), use_qk_l2norm=False, scale=0.3)
    state, expected = kda_recurrent_sequence(q, k, v, g, beta, initial[0], 0.3, False)
    assert not out.isnan().any() and not pool.isnan().any()
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool[0].double(), state, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(seed=st.integers(0, 2**16), fmt=st.sampled_from(["bf16", "fp8"]), kind=st.sampled_from(["latent", "index"]))
def test_cache_write_stores_packed_records_only_at_target_slots(seed, fmt, kind):
    gen = torch.Generator().manual_seed(seed)
    spec = latent_format(fmt) if kind == "latent" else index_format(fmt)
    pages = torch.randint(0, 256, (3, 4, spec.token_bytes), dtype=torch.uint8, generator=gen)
    before = pages.clone()
    values = torch.randn(5, spec.dim, generator=gen)
    slots = torch.tensor([7, -1, 0, 11, -1])
    scale = torch.tensor(0.02) if spec.needs_tensor_scale else None
    ops.cache_write(values, slots, pages, kind=kind, fmt=fmt, scale=scale)
    flat, flat_before = pages.reshape(12, -1), before.reshape(12, -1)
    packed = spec.pack(values, scale)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(flat[s], packed[i])
    untouched = [s for s in range(12) if s not in (7, 0, 11)]
    assert torch.equal(flat[untouched], flat_before[untouched])


def test_cache_write_through_a_strided_view_lands_in_the_pool():
    pool = torch.zeros(4, 2 * 8 * 256, dtype=torch.uint8)  # 4 rows, two layers' pages per row
    layer1 = pool[:, 8 * 256:].view(4, 8, 256)  # strided: row stride is 2 pages
    values = torch.randn(3, 128)
    ops.cache_write(values, torch.tensor([0, 9, 31]), layer1, kind="index", fmt="bf16")
    assert torch.count_nonzero(pool[:, : 8 * 256]) == 0
    assert torch.equal(pool[1, 8 * 256 + 256: 8 * 256 + 512], index_format("bf16").pack(values[1:2])[0])


def test_positions_to_slots_matches_python_lookup():
    block_table = torch.tensor([[3, 0, -1], [1, 2, 4]], dtype=torch.int32)
    positions = torch.tensor([[0, 5, 9, -1], [11, 4, 0, 3]], dtype=torch.int32)
    req_ids = torch.tensor([0, 1], dtype=torch.int32)
    got = ops.positions_to_slots(positions, req_ids, block_table, 4)
    expected = [[12, 1, -1, -1], [19, 8, 4, 7]]  # position 9 of request 0 sits in an unmapped block
    assert got.tolist() == expected


def test_topk_merge_at_world_size_one_is_topk():
    scores = torch.randn(3, 50)
    lengths = torch.tensor([50, 7, 0], dtype=torch.int32)
    assert torch.equal(ops.topk_merge(scores, lengths, 10), ops.topk(scores, lengths, 10))


def test_collectives_at_world_size_one_are_identities():
    x = torch.randn(4, 3)
    assert torch.equal(ops.all_gather(x), x[None])
    assert torch.equal(ops.all_to_all(x), x)


def test_dsa_attention_is_the_composition_of_the_ops():
    gen = torch.Generator().manual_seed(9)
    index_pages, _, _ = _paged_cache(4, 8, "index", "fp8", 1)
    kv_pages, _, _ = _paged_cache(4, 8, "latent", "bf16", 2)
    block_table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    positions = torch.tensor([5, 20, 31], dtype=torch.int32)
    req_ids = torch.zeros(3, dtype=torch.int32)
    q_index, weights = torch.randn(3, 2, 128, generator=gen), torch.rand(3, 2, generator=gen)
    q = torch.randn(3, 4, 576, generator=gen)
    o, lse = ops.dsa_attention(q_index, weights, index_pages, q, kv_pages, block_table, req_ids, positions,
                               index_fmt="fp8", kv_fmt="bf16", topk=6, max_context=32, softmax_scale=0.1)
    scores = ops.indexer_score(q_index, weights, index_pages, block_table, req_ids, positions, index_fmt="fp8",
                               max_context=32)
    chosen = ops.topk(scores, positions + 1, 6)
    slots = ops.positions_to_slots(chosen, req_ids, block_table, 8)
    o2, lse2 = ops.sparse_mla(q, kv_pages, slots, kv_fmt="bf16", softmax_scale=0.1)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("magnitude", [-1e30, -1e10, 1e10, 1e30])
def test_lse_combine_averages_equal_parts_at_any_magnitude(magnitude):
    """Two parts of equal lse combine to their average and lse + log 2 (the weights were exp(lse_r - lse) against a
    rounded lse: at 1e30 the two parts were summed)."""
    o_parts = torch.tensor([[[[1.0, 2.0]]], [[[3.0, 4.0]]]])  # [2 parts, 1 token, 1 head, 2]
    lse_parts = torch.full((2, 1, 1), magnitude)
    o, lse = ops.lse_combine(o_parts, lse_parts)
    torch.testing.assert_close(o[0, 0], torch.tensor([2.0, 3.0]), rtol=1e-6, atol=0.0)
    assert lse[0, 0].item() == pytest.approx(float(torch.tensor(magnitude).float()) + math.log(2), rel=1e-6)


def test_lse_combine_of_no_part_is_empty_attention():
    o, lse = ops.lse_combine(torch.randn(0, 2, 3, 8), torch.randn(0, 2, 3))
    assert torch.equal(o, torch.zeros(2, 3, 8)) and bool(torch.isneginf(lse).all())
