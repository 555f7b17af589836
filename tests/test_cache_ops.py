"""The reference ops read and write every format through the packed cache's views: cache_write lands
in the pool, sparse_mla / indexer_score read it back, kda_decode updates states in place."""
import pytest
import torch

from dsahal import ops
from dsahal.cache import PackedKVCache, plan_layout
from dsahal.config import load_config
from dsahal.formats import INDEX_FORMATS, LATENT_FORMATS, index_format, latent_format

CONFIG = load_config("tiny")  # layers kda, kda, kda, dsa
DSA_LAYER = CONFIG.dsa_layers[0]
BLOCK_TOKENS = 4


def make_cache(latent_fmt="bf16", index_fmt="fp8", rows=None):
    layout = plan_layout(CONFIG, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=BLOCK_TOKENS)
    return PackedKVCache(layout, num_rows=rows or 2 * layout.rows_per_state + 6)


def request_slots(blocks, length):
    """Physical slots of positions 0..length-1 of a request whose block table is ``blocks``."""
    pos = torch.arange(length)
    return torch.tensor(blocks)[pos // BLOCK_TOKENS] * BLOCK_TOKENS + pos % BLOCK_TOKENS


@pytest.mark.parametrize("fmt", sorted(LATENT_FORMATS))
def test_sparse_mla_reads_each_latent_format_through_the_cache_view(fmt):
    torch.manual_seed(1)
    cache = make_cache(latent_fmt=fmt)
    blocks = cache.allocate_blocks(3)
    kv = torch.randn(10, 576)
    scale = cache.latent_scale(DSA_LAYER)
    if scale is not None:
        scale.fill_(float(kv.abs().max()) / 448)
    slots = request_slots(blocks, 10)
    pool_before = cache.pool.clone()
    ops.cache_write(kv, slots, cache.latent_pages(DSA_LAYER), kind="latent", fmt=fmt, scale=scale)
    assert not torch.equal(cache.pool, pool_before)  # the write landed in the pool itself

    spec = latent_format(fmt)
    stored = spec.unpack(spec.pack(kv, scale), scale).double()  # what the cache now holds
    assert bool(((stored - kv).abs() <= spec.error_bound(kv, scale)).all())
    q = torch.randn(3, 2, 576)
    chosen = torch.tensor([[0, 9, 4, -1], [2, 2, 7, 5], [-1, -1, -1, -1]])
    picked = torch.where(chosen >= 0, slots[chosen.clamp_min(0)], torch.full_like(chosen, -1))
    o, lse = ops.sparse_mla(q, cache.latent_pages(DSA_LAYER), picked, kv_fmt=fmt, softmax_scale=0.1, kv_scale=scale)
    for t in range(2):
        rows = stored[chosen[t][chosen[t] >= 0]]
        logits = 0.1 * q[t].double() @ rows.T
        torch.testing.assert_close(lse[t].double(), torch.logsumexp(logits, -1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o[t].double(), torch.softmax(logits, -1) @ rows[:, :512], rtol=1e-4, atol=1e-5)
    assert bool((o[2] == 0).all()) and bool(torch.isneginf(lse[2]).all())


@pytest.mark.parametrize("fmt", sorted(INDEX_FORMATS))
def test_indexer_score_reads_each_index_format_through_the_cache_view(fmt):
    torch.manual_seed(2)
    cache = make_cache(index_fmt=fmt)
    blocks = cache.allocate_blocks(3)
    keys = torch.randn(11, 128)
    slots = request_slots(blocks, 11)
    ops.cache_write(keys, slots, cache.index_pages(DSA_LAYER), kind="index", fmt=fmt)
    spec = index_format(fmt)
    stored = spec.unpack(spec.pack(keys)).double()
    q, w = torch.randn(2, 4, 128), torch.rand(2, 4)
    positions = torch.tensor([10, 5], dtype=torch.int32)
    block_table = torch.tensor([blocks], dtype=torch.int32)
    scores = ops.indexer_score(q, w, cache.index_pages(DSA_LAYER), block_table, torch.zeros(2, dtype=torch.int32),
                               positions, index_fmt=fmt, max_context=12)
    for t in range(2):
        visible = int(positions[t]) + 1
        expected = (w[t].double()[:, None] * torch.relu(q[t].double() @ stored[:visible].T)).sum(0)
        torch.testing.assert_close(scores[t, :visible].double(), expected, rtol=1e-5, atol=1e-5)
        assert bool(torch.isneginf(scores[t, visible:]).all())


@pytest.mark.parametrize("latent_fmt,index_fmt", [("nvfp4", "mxfp4"), ("fp8_ds_mla", "fp8"), ("fp8", "bf16")])
def test_writes_to_one_page_kind_leave_the_other_and_skipped_slots_untouched(latent_fmt, index_fmt):
    cache = make_cache(latent_fmt, index_fmt)
    blocks = cache.allocate_blocks(2)
    slots = request_slots(blocks, 6)
    slots[3] = -1  # skipped
    index_before = cache.index_pages(DSA_LAYER).clone()
    latent = cache.latent_pages(DSA_LAYER)
    ops.cache_write(torch.randn(6, 576), slots, latent, kind="latent", fmt=latent_fmt,
                    scale=cache.latent_scale(DSA_LAYER))
    assert torch.equal(cache.index_pages(DSA_LAYER), index_before)
    skipped = request_slots(blocks, 6)[3]
    assert bool((latent[skipped // BLOCK_TOKENS, skipped % BLOCK_TOKENS] == 0).all())


def test_kda_decode_updates_states_in_place_through_the_state_view():
    torch.manual_seed(3)
    cache = make_cache()
    first, second = cache.allocate_state(), cache.allocate_state()
    layer, other = CONFIG.kda_layers[0], CONFIG.kda_layers[1]
    states = cache.kda_states(layer)
    states[first] = torch.randn_like(states[first])
    heads, dim = states.shape[1], states.shape[2]
    q, k, v = torch.randn(2, heads, dim), torch.randn(2, heads, dim), torch.randn(2, heads, dim)
    g, beta = -torch.rand(2, heads, dim), torch.rand(2, heads)
    standalone, before = states.clone(), states.clone()
    other_before = cache.kda_states(other).clone()
    ids = torch.tensor([second, first], dtype=torch.int32)
    out_cache = ops.kda_decode(q, k, v, g, beta, states, ids)
    out_plain = ops.kda_decode(q, k, v, g, beta, standalone, ids)
    torch.testing.assert_close(out_cache, out_plain, rtol=0, atol=0)
    torch.testing.assert_close(cache.kda_states(layer), standalone, rtol=0, atol=0)  # landed in the pool
    assert not torch.equal(cache.kda_states(layer), before)  # the step did change the states
    assert torch.equal(cache.kda_states(other), other_before)
