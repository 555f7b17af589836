"""The model's lightning-indexer path against a float64 reference of DeepSeek-V3.2's ``Indexer.forward``
(public ``inference/model.py``): RoPE (non-interleaved) on the first 64 dims, LayerNorm (eps 1e-6) on
the key, ``rotate_activation`` (normalised Walsh-Hadamard), ``act_quant`` of q and k (per 128 dims,
scale_fmt ue8m0), head weights ``weights_proj(x) · Hi^-0.5 · q_scale · 128^-0.5``, and ``fp8_index``
``Σ_h w · relu(q8 · k8) · k_scale``. Tiny dims: 4 index heads, 24 tokens, hidden 128."""
import pytest
import torch
import torch.nn.functional as F

from dsahal import ops
from dsahal.model import HybridModel, init_weights
from dsahal.model.indexer import hadamard_rotate, quantize_query_fp8
from test_model_helpers import small_config
from test_model_rope import DEEPSEEK_YARN, WithFields, ref_apply_rotary_emb, ref_precompute_freqs_cis

BLOCK_TOKENS = 16
FP8_MAX = 448.0


def sylvester(n: int) -> torch.Tensor:
    """``[n, n]`` float64 Walsh-Hadamard matrix, natural (Sylvester) order, scaled by n^-0.5."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h * n ** -0.5


def ref_act_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant over the last dim, ue8m0 scales: (x8 as float64, scale ``[...]`` float64)."""
    amax = x.abs().amax(dim=-1).clamp_min(1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    x8 = (x / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double()
    return x8, scale


def ref_indexer_scores(layer, x, positions, rotate=True):
    """``[T, S]`` float64 scores over keys 0..S-1 (S = last position + 1; -inf past each query's own)."""
    x64 = x.double()
    heads, dim, rope = layer.index_heads, layer.index_dim, 64
    qr = layer.q_norm(layer.q_down(x)).double()  # Indexer.forward's qr input (MLA's normed q_a)
    freqs = ref_precompute_freqs_cis(rope, int(positions.max()) + 1, 10000.0, DEEPSEEK_YARN["factor"],
                                     DEEPSEEK_YARN["original_max_position_embeddings"], 32, 1)[positions.long()]
    q = (qr @ layer.index_q_up.weight.double().T).view(len(x), heads, dim)
    q = torch.cat([ref_apply_rotary_emb(q[..., :rope], freqs, interleaved=False), q[..., rope:]], dim=-1)
    norm = layer.index_k_norm
    k = F.layer_norm(x64 @ layer.index_k_proj.weight.double().T, (dim,), norm.weight.double(), norm.bias.double(),
                     eps=1e-6)
    k = torch.cat([ref_apply_rotary_emb(k[:, None, :rope], freqs, interleaved=False)[:, 0], k[:, rope:]], dim=-1)
    if rotate:
        hadamard = sylvester(dim)
        q, k = q @ hadamard, k @ hadamard
    q8, q_scale = ref_act_quant(q)
    k8, k_scale = ref_act_quant(k)
    weights = (x64 @ layer.index_weights_proj.weight.double().T) * heads ** -0.5
    weights = weights * q_scale * dim ** -0.5  # [T, Hi]
    logits = torch.einsum("thd,sd->tsh", q8, k8).clamp_min(0)
    scores = (logits * weights[:, None, :]).sum(-1) * k_scale[None, :]
    visible = torch.arange(len(x))[None, :] <= torch.arange(len(x))[:, None]
    return scores.masked_fill(~visible, float("-inf"))


def test_hadamard_is_the_normalised_sylvester_matrix_and_orthonormal():
    h = hadamard_rotate(torch.eye(128, dtype=torch.float64))  # row i: e_i · H
    assert torch.equal(h, sylvester(128))
    torch.testing.assert_close(h @ h.T, torch.eye(128, dtype=torch.float64), rtol=0, atol=1e-15)
    x = torch.randn(5, 3, 128, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(hadamard_rotate(x).norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(hadamard_rotate(hadamard_rotate(x)), x, rtol=1e-6, atol=1e-6)  # H symmetric
    assert hadamard_rotate(x.bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="hadamard_rotate: last dim expected a power of two, got 96"):
        hadamard_rotate(torch.zeros(2, 96))


def test_query_quantisation_is_act_quant_with_power_of_two_scales():
    q = torch.randn(6, 4, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    q[0, 0] = 0  # an all-zero head: the 1e-4 floor
    q8, scale = quantize_query_fp8(q.float())
    ref8, ref_scale = ref_act_quant(q)
    assert q8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    torch.testing.assert_close(scale.double(), ref_scale, rtol=0, atol=0)
    torch.testing.assert_close(q8.double(), ref8, rtol=0, atol=0)
    _, plain = quantize_query_fp8(q.float(), "fp32")
    torch.testing.assert_close(plain.double(), q.abs().amax(-1).clamp_min(1e-4) / FP8_MAX)
    with pytest.raises(ValueError, match="scale_fmt expected one of"):
        quantize_query_fp8(q.float(), "e5m2")


def one_request_at(start, tokens):
    """A request's tokens ``start..start+tokens-1``; only the blocks holding them are mapped."""
    positions = torch.arange(start, start + tokens, dtype=torch.int32)
    logical = torch.unique(positions // BLOCK_TOKENS)
    table = torch.full((1, int(logical.max()) + 1), -1, dtype=torch.int32)
    table[0, logical.long()] = torch.arange(len(logical), dtype=torch.int32)
    slots = table[0, (positions // BLOCK_TOKENS).long()].long() * BLOCK_TOKENS + positions.long() % BLOCK_TOKENS
    return positions, table, slots, len(logical)


@torch.no_grad()
def test_model_indexer_scores_equal_deepseek_v32_indexer_forward():
    config = WithFields(small_config(index_heads=4), rope_scaling=DEEPSEEK_YARN)
    model = init_weights(HybridModel(config), seed=0).eval()
    layer = next(b.attn for b in model.blocks if b.kind == "dsa")
    assert layer.index_k_norm.eps == 1e-6
    with torch.no_grad():  # a non-trivial LayerNorm, so its weight and bias are checked too
        layer.index_k_norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(2))
        layer.index_k_norm.bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
    start, tokens = 4090, 24
    positions, table, slots, blocks = one_request_at(start, tokens)
    x = torch.randn(tokens, config.hidden_size, generator=torch.Generator().manual_seed(4))
    x[:, :3] *= 20  # outlier channels, as real activations have: what the rotation is for

    c_q = layer.q_norm(layer.q_down(x))
    q_index, k_index, weights = layer.indexer_inputs(x, c_q, positions)
    assert q_index.dtype == torch.float8_e4m3fn and weights.dtype == torch.float32
    pages = torch.zeros(blocks, BLOCK_TOKENS, 132, dtype=torch.uint8)
    ops.cache_write(k_index, slots, pages, kind="index", fmt="fp8")
    max_context = table.shape[1] * BLOCK_TOKENS
    scores = ops.indexer_score(q_index, weights, pages, table, torch.zeros(tokens, dtype=torch.int32), positions,
                               index_fmt="fp8", max_context=max_context)
    ours = scores[:, start:start + tokens].double()
    assert torch.isinf(scores[:, :start // BLOCK_TOKENS * BLOCK_TOKENS]).all()  # the unmapped blocks

    ref = ref_indexer_scores(layer, x, positions)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(ours), finite)
    scale = ref[finite].abs().max()
    torch.testing.assert_close(ours[finite], ref[finite], rtol=1e-4, atol=1e-5 * float(scale))
    # without the rotation the FP8 scores are measurably different: the reference tells them apart
    unrotated = ref_indexer_scores(layer, x, positions, rotate=False)
    assert (unrotated[finite] - ref[finite]).abs().max() > 1e-3 * scale


def test_index_norm_eps_is_read_from_the_config():
    layer = next(b.attn for b in HybridModel(WithFields(small_config(), index_norm_eps=1e-5)).blocks
                 if b.kind == "dsa")
    assert layer.index_k_norm.eps == 1e-5
    with pytest.raises(ValueError, match="config field 'index_norm_eps' expected a number > 0, got 0"):
        HybridModel(WithFields(small_config(), index_norm_eps=0))
