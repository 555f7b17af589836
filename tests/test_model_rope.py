"""RoPE (dsahal.model.rope) against a float64 reference written from DeepSeek-V3.2-Exp's public
``inference/model.py``: ``precompute_freqs_cis`` (YaRN's correction range and linear ramp) and
``apply_rotary_emb`` (complex multiplication of adjacent pairs; ``interleaved=False`` regroups the
halves first), and the MLA layer's use of it (layouts, softmax scale)."""
import math

import pytest
import torch

from dsahal.model import HybridModel, init_weights
from dsahal.model.rope import Rope, Yarn, inv_frequencies, mla_softmax_scale, rope_from_config, yarn_from_config
from test_model_helpers import small_config

DEEPSEEK_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
KIMI_YARN = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


class WithFields:
    """A model config with extra fields (rope_scaling, layouts) that the layers read with getattr."""

    def __init__(self, base, **extra):
        self._base = base
        self.__dict__.update(extra)

    def __getattr__(self, name):
        return getattr(self._base, name)


# ---- the float64 reference, from DeepSeek-V3.2-Exp inference/model.py ----

def ref_precompute_freqs_cis(dim, seqlen, theta, factor, original_seq_len, beta_fast, beta_slow):
    """``[seqlen, dim/2]`` complex128, as ``precompute_freqs_cis`` (YaRN when seqlen > original_seq_len)."""
    def find_correction_dim(num_rotations):
        return dim * math.log(original_seq_len / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

    def find_correction_range(low_rot, high_rot):
        low = math.floor(find_correction_dim(low_rot))
        high = math.ceil(find_correction_dim(high_rot))
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(lo, hi, n):
        if lo == hi:
            hi += 0.001
        return torch.clamp((torch.arange(n, dtype=torch.float64) - lo) / (hi - lo), 0, 1)

    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if seqlen > original_seq_len:
        low, high = find_correction_range(beta_fast, beta_slow)
        smooth = 1 - linear_ramp_factor(low, high, dim // 2)
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    t = torch.arange(seqlen, dtype=torch.float64)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def ref_apply_rotary_emb(x, freqs_cis, interleaved=True):
    """x ``[S, H, d]`` float64, freqs_cis ``[S, d/2]`` -> ``[S, H, d]`` float64 (``apply_rotary_emb``)."""
    shape = x.shape
    if not interleaved:
        x = x.view(*shape[:-1], 2, -1).transpose(-1, -2).contiguous()
    xc = torch.view_as_complex(x.double().reshape(*shape[:-1], -1, 2).contiguous())
    y = torch.view_as_real(xc * freqs_cis[:, None, :]).flatten(-2)
    if not interleaved:
        y = torch.cat([y[..., 0::2], y[..., 1::2]], dim=-1)
    return y


def ref_mscale(factor, mscale):
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


# ---- tests ----

@pytest.mark.parametrize("theta,scaling", [(10000.0, DEEPSEEK_YARN), (50000.0, KIMI_YARN)])
def test_yarn_frequencies_equal_deepseek_precompute_freqs_cis(theta, scaling):
    config = WithFields(small_config(rope_theta=theta), rope_scaling=scaling)
    yarn = yarn_from_config(config)
    ours = inv_frequencies(64, theta, yarn, dtype=torch.float64)
    ref = ref_precompute_freqs_cis(64, 4097, theta, scaling["factor"], 4096, scaling["beta_fast"],
                                   scaling["beta_slow"])[1].angle()  # position 1: the frequencies themselves
    torch.testing.assert_close(ours, ref, rtol=1e-13, atol=0)
    plain = inv_frequencies(64, theta, None, dtype=torch.float64)
    assert torch.equal(ours[:2], plain[:2])  # the fastest pairs are kept (extrapolated) ...
    torch.testing.assert_close(ours[-1], plain[-1] / scaling["factor"], rtol=1e-13, atol=0)  # ... slow ones / factor


@pytest.mark.parametrize("layout,interleaved", [("interleaved", True), ("rotate_half", False)])
@pytest.mark.parametrize("scaling", [None, DEEPSEEK_YARN])
def test_rope_equals_apply_rotary_emb_at_long_positions(layout, interleaved, scaling):
    config = WithFields(small_config(), rope_scaling=scaling, rope_layout=layout)
    rope = rope_from_config(config, 64, "rope_layout", "interleaved")
    positions = torch.tensor([0, 1, 7, 4095, 4096, 33333, 163839])
    x = torch.randn(len(positions), 3, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    cos, sin = rope.cos_sin(positions)
    ours = rope.apply(x, cos.double(), sin.double())
    factor = scaling["factor"] if scaling else 1.0
    freqs = ref_precompute_freqs_cis(64, 163840, 10000.0, factor, 4096 if scaling else 163840, 32, 1)
    ref = ref_apply_rotary_emb(x, freqs[positions], interleaved)
    # cos/sin are fp32 (2^-24 relative) of float64 angles: no fp32 angle error even at 160K
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-7 * float(x.abs().max()))
    other = ref_apply_rotary_emb(x, freqs[positions], not interleaved)
    assert (ours - other)[1:].abs().max() > 1e-2  # the layout matters: the test tells them apart


def test_yarn_mscale_scales_the_softmax_and_the_attention_factor():
    base = small_config()
    assert mla_softmax_scale(base) == pytest.approx(192 ** -0.5, rel=1e-15)
    yarn = WithFields(base, rope_scaling=DEEPSEEK_YARN)
    assert mla_softmax_scale(yarn) == pytest.approx(192 ** -0.5 * ref_mscale(40, 1.0) ** 2, rel=1e-15)
    assert ref_mscale(40, 1.0) ** 2 > 1.8  # ≈ 1.87: a real change of the scale
    no_stretch = WithFields(base, rope_scaling=dict(DEEPSEEK_YARN, factor=1.0))
    assert mla_softmax_scale(no_stretch) == pytest.approx(192 ** -0.5, rel=1e-15)
    rope = Rope(64, 10000.0, "interleaved", Yarn(40.0, 4096, mscale=0.707, mscale_all_dim=1.0))
    assert rope.attention_factor == pytest.approx(ref_mscale(40, 0.707) / ref_mscale(40, 1.0), rel=1e-15)
    cos, sin = rope.cos_sin(torch.tensor([3]))
    torch.testing.assert_close(cos.square() + sin.square(), torch.full_like(cos, rope.attention_factor ** 2))


@torch.no_grad()
def test_mla_layer_applies_interleaved_yarn_rope_to_the_query_and_the_cached_key():
    config = WithFields(small_config(), rope_scaling=DEEPSEEK_YARN)
    model = init_weights(HybridModel(config), seed=0).eval()
    layer = next(b.attn for b in model.blocks if b.kind == "dsa")
    assert layer.rope.layout == "interleaved" and layer.index_rope.layout == "rotate_half"  # the checkpoints'
    assert layer.softmax_scale == pytest.approx(192 ** -0.5 * ref_mscale(40, 1.0) ** 2)
    positions = torch.tensor([0, 5, 4100, 70000])
    x = torch.randn(4, config.hidden_size, generator=torch.Generator().manual_seed(1))
    cos, sin = layer.rope.cos_sin(positions)
    freqs = ref_precompute_freqs_cis(64, 70001, 10000.0, 40, 4096, 32, 1)[positions]
    c_q = layer.q_norm(layer.q_down(x))
    q_pe = layer.q_up(c_q).view(4, layer.heads, 192)[..., 128:]
    torch.testing.assert_close(layer.queries(c_q, cos, sin)[1].double(), ref_apply_rotary_emb(q_pe, freqs),
                               rtol=1e-5, atol=1e-5)
    k_pe = layer.kv_down(x)[:, 512:]
    torch.testing.assert_close(layer.latent(x, cos, sin)[:, 512:].double(),
                               ref_apply_rotary_emb(k_pe[:, None], freqs)[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extra,named", [
    ({"rope_layout": "adjacent"}, "'rope_layout'"),
    ({"index_rope_layout": "halves"}, "'index_rope_layout'"),
    ({"rope_scaling": {"type": "linear", "factor": 2}}, "'rope_scaling.type'"),
    ({"rope_scaling": {"type": "yarn", "factor": 4}}, "'rope_scaling.original_max_position_embeddings'"),
    ({"rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "alpha": 1}},
     "unknown keys ['alpha']"),
    ({"rope_scaling": {"type": "yarn", "factor": "4", "original_max_position_embeddings": 4096}},
     "'rope_scaling.factor'"),
    ({"rope_scaling": [40]}, "'rope_scaling'"),
])
def test_bad_rope_fields_are_named(extra, named):
    with pytest.raises(ValueError, match="expected") as err:
        HybridModel(WithFields(small_config(), **extra))
    assert named in str(err.value)
