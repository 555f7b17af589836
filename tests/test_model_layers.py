"""The model's attention layers against plain-torch formulations written here from their weights."""
import math

import pytest
import torch

from dsahal.engine import write_slots
from dsahal.model import BatchMeta, DsaLayerCache
from dsahal.model.dsa_attention import LocalDsaAttention
from dsahal.model.kda_layer import KdaStates
from dsahal.model.layers import apply_rotary, rotary_cos_sin
from dsahal.model.mla_layer import MlaLayer
from test_model_helpers import small_config, small_model

BLOCK_TOKENS = 16


def one_request_meta(length, *, start=0, state_id=0, decode=False, num_blocks=16):
    """Metadata of one request's tokens ``start..start+length-1`` mapped to blocks 0..num_blocks-1."""
    positions = torch.arange(start, start + length, dtype=torch.int32)
    rows = torch.zeros(length, dtype=torch.int32)
    table = torch.arange(num_blocks, dtype=torch.int32)[None, :]
    return BatchMeta(positions, rows, table, write_slots(table, rows, positions, BLOCK_TOKENS),
                     torch.tensor([0, length], dtype=torch.int32), torch.tensor([state_id], dtype=torch.int32),
                     num_blocks * BLOCK_TOKENS, decode)


def mla_cache(num_blocks=16):
    return DsaLayerCache(torch.zeros(num_blocks, BLOCK_TOKENS, 1152, dtype=torch.uint8),
                         torch.zeros(num_blocks, BLOCK_TOKENS, 132, dtype=torch.uint8), "bf16", "fp8", None)


def mla_layer(config):
    model = small_model(config)
    return next(b.attn for b in model.blocks if b.kind == "dsa")


def dense_mla(layer: MlaLayer, x: torch.Tensor) -> torch.Tensor:
    """Causal dense MLA in the *non-absorbed* form: per-head keys and values expanded from the latent.
    The latent is rounded to bf16 as the cache stores it; everything else in float64."""
    tokens = x.shape[0]
    positions = torch.arange(tokens)
    cos, sin = rotary_cos_sin(positions, layer.rope_dim, layer.rope_theta)
    c_q = layer.q_norm(layer.q_down(x))
    q_nope, q_rope = layer.queries(c_q, cos, sin)
    latent = layer.latent(x, cos, sin).to(torch.bfloat16).double()
    c_kv, k_rope = latent[:, :layer.latent_rank], latent[:, layer.latent_rank:]
    w_uk, w_uv = (w.double() for w in layer.absorbed_weights())
    k_nope = torch.einsum("hdr,sr->shd", w_uk, c_kv)  # [S, H, 128]
    values = torch.einsum("hvr,sr->shv", w_uv, c_kv)  # [S, H, 128]
    logits = torch.einsum("thd,shd->hts", q_nope.double(), k_nope) + torch.einsum("thd,sd->hts", q_rope.double(),
                                                                                   k_rope)
    scale = 1.0 / math.sqrt(layer.nope_dim + layer.rope_dim)  # mscale = 1
    causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
    probs = torch.softmax((scale * logits).masked_fill(~causal, float("-inf")), dim=-1)
    o = torch.einsum("hts,shv->thv", probs, values)
    return layer.o_proj(o.reshape(tokens, -1).to(x.dtype))


@torch.no_grad()
def test_sparse_mla_equals_dense_mla_when_topk_covers_the_context():
    tokens = 90
    layer = mla_layer(small_config(index_topk=128))
    x = torch.randn(tokens, layer.q_down.in_features, generator=torch.Generator().manual_seed(1))
    sparse = layer(x, one_request_meta(tokens), mla_cache(), LocalDsaAttention())
    torch.testing.assert_close(sparse, dense_mla(layer, x), rtol=2e-4, atol=2e-4)


@torch.no_grad()
def test_sparse_mla_differs_from_dense_when_topk_is_smaller_than_the_context():
    tokens = 90
    layer = mla_layer(small_config(index_topk=8))
    x = torch.randn(tokens, layer.q_down.in_features, generator=torch.Generator().manual_seed(1))
    sparse = layer(x, one_request_meta(tokens), mla_cache(), LocalDsaAttention())
    dense = dense_mla(layer, x)
    torch.testing.assert_close(sparse[:8], dense[:8], rtol=2e-4, atol=2e-4)  # the first 8 tokens see ≤ 8 keys
    assert (sparse[8:] - dense[8:]).abs().max() > 1e-3


@torch.no_grad()
def test_fused_and_separate_dsa_ops_give_the_same_layer_output():
    tokens = 70
    layer = mla_layer(small_config(index_topk=16))
    x = torch.randn(tokens, layer.q_down.in_features, generator=torch.Generator().manual_seed(2))
    fused = layer(x, one_request_meta(tokens), mla_cache(), LocalDsaAttention(fused=True))
    separate = layer(x, one_request_meta(tokens), mla_cache(), LocalDsaAttention(fused=False))
    torch.testing.assert_close(fused, separate, rtol=0, atol=0)


def test_the_separate_dsa_ops_over_score_ranges_give_the_one_range_output(monkeypatch):
    from dsahal.ops import score_ranges

    tokens = 30
    layer = mla_layer(small_config(index_topk=16))
    x = torch.randn(tokens, layer.q_down.in_features, generator=torch.Generator().manual_seed(4))
    whole = layer(x, one_request_meta(tokens), mla_cache(), LocalDsaAttention(fused=False))
    widths = []
    real = score_ranges.score_ranges
    monkeypatch.setattr(score_ranges, "score_ranges", lambda t, w: widths.append(w) or real(t, w))
    monkeypatch.setattr(score_ranges, "SCORES_BUDGET_BYTES", 1)  # a token a range
    ranged = layer(x, one_request_meta(tokens), mla_cache(), LocalDsaAttention(fused=False))
    assert widths and len(real(tokens, widths[0])) == tokens
    torch.testing.assert_close(ranged, whole, rtol=0, atol=0)


def kda_layer(seed=0):
    config = small_config()
    return next(b.attn for b in small_model(config, seed=seed).blocks if b.kind == "kda"), config


@torch.no_grad()
def test_kda_decay_is_a_log_decay_at_most_zero():
    layer, config = kda_layer()
    x = 5 * torch.randn(50, config.hidden_size)
    g = layer.log_decay(x)
    assert g.shape == (50, config.kda_num_heads, config.kda_head_dim)
    assert bool((g <= 0).all()) and bool((g < 0).any())


@torch.no_grad()
def test_kda_prefill_then_decode_equals_prefill_of_the_whole_sequence():
    layer, config = kda_layer()
    prompt, extra = 37, 6
    x = torch.randn(prompt + extra, config.hidden_size, generator=torch.Generator().manual_seed(3))
    whole_pool, split_pool = (KdaStates.zeros(2, config.kda_num_heads, config.kda_head_dim, layer.conv_kernel)
                              for _ in range(2))
    whole = layer(x, one_request_meta(prompt + extra), whole_pool)
    parts = [layer(x[:prompt], one_request_meta(prompt), split_pool)]
    for t in range(prompt, prompt + extra):
        parts.append(layer(x[t:t + 1], one_request_meta(1, start=t, decode=True), split_pool))
    torch.testing.assert_close(torch.cat(parts), whole, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(split_pool.recurrent, whole_pool.recurrent, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(split_pool.conv, whole_pool.conv, rtol=1e-4, atol=1e-5)
    for pool in (split_pool.recurrent, split_pool.conv):  # only its own state slot
        assert pool[0].abs().max() > 0 and pool[1].abs().max() == 0


def test_rotary_preserves_norm_and_depends_on_relative_position():
    x, y = torch.randn(1, 3, 64), torch.randn(1, 3, 64)
    def rotated(v, p):
        cos, sin = rotary_cos_sin(torch.tensor([p]), 64, 10000.0)
        return apply_rotary(v, cos, sin)
    torch.testing.assert_close(rotated(x, 7).norm(dim=-1), x.norm(dim=-1))
    dot = lambda a, b: (a * b).sum(-1)  # noqa: E731
    torch.testing.assert_close(dot(rotated(x, 9), rotated(y, 4)), dot(rotated(x, 15), rotated(y, 10)),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("field,value", [
    ("rope_theta", -1.0), ("kda_gate_rank", 0), ("q_lora_rank", 0), ("layer_kinds", ()), ("rms_norm_eps", 0.0),
])
def test_bad_model_config_is_named_in_the_error(field, value):
    import dataclasses

    from dsahal.model import HybridModel

    with pytest.raises(ValueError, match=f"field '{field}' expected"):
        HybridModel(dataclasses.replace(small_config(), **{field: value}))


@pytest.mark.parametrize("preset", ["tiny", "k31-pro-slice"])
def test_presets_build_with_their_real_attention_shapes(preset):
    from dsahal.config import load_config
    from dsahal.model import HybridModel

    config = load_config(preset)
    with torch.device("meta"):  # shapes only: k31-pro-slice holds ~5e9 parameters
        model = HybridModel(config)
    mla = next(b.attn for b in model.blocks if b.kind == "dsa")
    w_uk, w_uv = mla.absorbed_weights()
    assert w_uk.shape == (config.num_heads, 128, 512) and w_uv.shape == (config.num_heads, 128, 512)
    assert mla.index_q_up.out_features == config.index_heads * 128 and mla.index_k_proj.out_features == 128
    assert [b.kind for b in model.blocks] == list(config.layer_kinds)
    assert mla.softmax_scale == pytest.approx(192 ** -0.5)
