"""The MLA layer with the DSA lightning indexer (DeepSeek-V3.2 / Kimi K3.1 Pro), absorbed form.

Per token x ``[hidden]``, with H heads, latent rank r = 512, RoPE dim 64, nope dim 128, V dim 128:

    c_q     = RMSNorm(W_q↓ x)                                 [q_lora_rank]
    q       = W_q↑ c_q → per head (q_nope [128], q_rope [64]);   q_rope ← RoPE(q_rope)
    c_kv, k_rope = W_kv↓ x → ([512], [64]);  c_kv ← RMSNorm(c_kv);  k_rope ← RoPE(k_rope)
    cached latent    = [c_kv, k_rope]                         [576]
    absorbed query   = [W_UKᵀ q_nope, q_rope]                 [H, 576]   (W_UK: [H, 128, 512])
    o_latent = sparse attention over the top-k tokens          [H, 512]
    out      = W_o · (W_UV o_latent)                          (W_UV: [H, 128, 512])

So ``q_abs · latent = q_nope · (W_UK c_kv) + q_rope · k_rope``: exactly the non-absorbed logit, and the
softmax scale is the model's ``(128 + 64)^-0.5 · mscale²``, times YaRN's ``m(mscale_all_dim)²`` when the
config's ``rope_scaling`` stretches the context (:func:`dsahal.model.rope.mla_softmax_scale`).

RoPE (:mod:`dsahal.model.rope`): YaRN-corrected frequencies when the config's ``rope_scaling`` says
so (and YaRN's ``mscale_all_dim`` in the softmax scale), MLA's pairs in ``rope_layout`` (default
``"interleaved"``, the real weights' layout), the indexer's in ``index_rope_layout`` (default
``"rotate_half"``, as DeepSeek-V3.2's indexer applies it).

The indexer (its own projections, :mod:`dsahal.model.indexer`): ``q_i = W_iq c_q`` ``[Hi, 128]``,
``k_i = LayerNorm(W_ik x)`` ``[128]`` (one shared key head, eps ``index_norm_eps``, default 1e-6),
RoPE on the first 64 dims of both (as DeepSeek-V3.2 places it), then both rotated by the
normalised Hadamard matrix; the query is quantised to FP8 per (token, head) and its scale folded
into the head weights ``w = W_iw x · Hi^-0.5 · 128^-0.5 · s_q``. Index keys are written in the
cache's index format (FP8 with a per-token power-of-two scale by default).
"""
from __future__ import annotations

import torch
from torch import nn

from . import fused
from .batch import BatchMeta, DsaLayerCache
from .dsa_attention import DsaAttention
from .indexer import INDEX_SCALE_FORMATS, hadamard_rotate, index_query_and_weights
from .layers import RMSNorm
from .packed import project
from .rope import mla_softmax_scale, rope_from_config

INDEX_ROPE_DIM = 64


class MlaLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_heads
        self.heads, self.nope_dim, self.rope_dim = heads, config.qk_nope_dim, config.qk_rope_dim
        self.v_dim, self.latent_rank = config.v_head_dim, config.kv_lora_rank
        self.index_heads, self.index_dim = config.index_heads, config.index_dim
        self.topk, self.rope_theta = config.index_topk, config.rope_theta
        self.rope = rope_from_config(config, self.rope_dim, "rope_layout", "interleaved")
        self.index_rope = rope_from_config(config, INDEX_ROPE_DIM, "index_rope_layout", "rotate_half")
        self.softmax_scale = mla_softmax_scale(config)
        self.index_query_fp8 = bool(getattr(config, "index_query_fp8", True))
        self.index_scale_fmt = getattr(config, "index_scale_fmt", None) or "ue8m0"
        if self.index_scale_fmt not in INDEX_SCALE_FORMATS:
            raise ValueError(f"MlaLayer: config field 'index_scale_fmt' expected one of {list(INDEX_SCALE_FORMATS)}, "
                             f"got {self.index_scale_fmt!r}")
        index_eps = getattr(config, "index_norm_eps", 1e-6)
        if isinstance(index_eps, bool) or not isinstance(index_eps, (int, float)) or not index_eps > 0:
            raise ValueError(f"MlaLayer: config field 'index_norm_eps' expected a number > 0, got {index_eps!r}")
        self.q_down = nn.Linear(hidden, config.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_up = nn.Linear(config.q_lora_rank, heads * (self.nope_dim + self.rope_dim), bias=False)
        self.kv_down = nn.Linear(hidden, self.latent_rank + self.rope_dim, bias=False)
        self.kv_norm = RMSNorm(self.latent_rank, config.rms_norm_eps)
        # rows per head: 128 of W_UK then 128 of W_UV, each a map from the 512-dim latent
        self.kv_up = nn.Linear(self.latent_rank, heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=False)
        self.index_q_up = nn.Linear(config.q_lora_rank, self.index_heads * self.index_dim, bias=False)
        self.index_k_proj = nn.Linear(hidden, self.index_dim, bias=False)
        self.index_k_norm = nn.LayerNorm(self.index_dim, eps=float(index_eps))
        self.index_weights_proj = nn.Linear(hidden, self.index_heads, bias=False)

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK ``[H, 128, 512]`` and W_UV ``[H, 128, 512]`` (views of ``kv_up.weight``)."""
        per_head = self.kv_up.weight.view(self.heads, self.nope_dim + self.v_dim, self.latent_rank)
        return per_head[:, : self.nope_dim], per_head[:, self.nope_dim:]

    def latent(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The cached latent ``[T, 576]``: normalised c_kv then the RoPE'd shared key."""
        c_kv, k_rope = self.kv_down(x).split([self.latent_rank, self.rope_dim], dim=-1)
        return torch.cat([self.kv_norm(c_kv), self.rope.apply(k_rope, cos, sin)], dim=-1)

    def queries(self, c_q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(q_nope ``[T, H, 128]``, q_rope ``[T, H, 64]`` with RoPE applied) from c_q ``[T, q_lora_rank]``."""
        q = self.q_up(c_q).view(c_q.shape[0], self.heads, self.nope_dim + self.rope_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        return q_nope, self.rope.apply(q_rope, cos, sin)

    def index_key(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The indexer's shared key ``[T, 128]`` (x's dtype): LayerNorm, RoPE on the first 64 dims,
        Hadamard rotation; the cache's index format quantises it when it is written."""
        k = self.index_k_norm(self.index_k_proj(x))
        k = torch.cat([self.index_rope.apply(k[..., :INDEX_ROPE_DIM], cos, sin), k[..., INDEX_ROPE_DIM:]], dim=-1)
        return hadamard_rotate(k)

    def index_query(self, c_q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The indexer's query ``[T, Hi, 128]`` before the Hadamard rotation: RoPE on the first 64 dims."""
        q = self.index_q_up(c_q).view(c_q.shape[0], self.index_heads, self.index_dim)
        return torch.cat([self.index_rope.apply(q[..., :INDEX_ROPE_DIM], cos, sin), q[..., INDEX_ROPE_DIM:]], dim=-1)

    def indexer_inputs(self, x: torch.Tensor, c_q: torch.Tensor, positions: torch.Tensor):
        """(q_index ``[T, Hi, 128]`` float8_e4m3fn (x's dtype with ``index_query_fp8`` off), k_index
        ``[T, 128]`` x's dtype, weights ``[T, Hi]`` fp32 with the query's FP8 scale folded in)."""
        cos, sin = self.index_rope.cos_sin(positions)
        q, weights = index_query_and_weights(self.index_query(c_q, cos, sin), self.index_weights_proj(x),
                                             fp8=self.index_query_fp8, scale_fmt=self.index_scale_fmt)
        return q, self.index_key(x, cos, sin), weights

    def forward(self, x: torch.Tensor, meta: BatchMeta, cache: DsaLayerCache, attention: DsaAttention) -> torch.Tensor:
        """x ``[T, hidden]`` -> ``[T, hidden]``; writes the tokens' latent and index key to the cache first,
        so each token attends to itself and its request's earlier tokens.

        The same values as :meth:`queries`, :meth:`latent` and :meth:`indexer_inputs`, in fewer launches (the
        eager decode step is bound by host time per launch): cos / sin once per step for every rope of the same
        frequencies (:meth:`BatchMeta.once`), the query's and the shared key's RoPE in one rotation (the key as
        one more head), the indexer's query and key likewise through one RoPE and one Hadamard rotation. With the
        model's fused kernels on (:mod:`dsahal.model.fused`) each of those two is one kernel (:meth:`query_latent`,
        :meth:`fused_indexer_inputs`).
        """
        tokens, heads = x.shape[0], self.heads
        cos, sin = self.cos_sin(self.rope, meta)
        # Every projection of x in one matmul where the weights are packed (dsahal.model.packed).
        q_low, kv, index_k, index_w = project(x, (self.q_down, self.kv_down, self.index_k_proj,
                                                  self.index_weights_proj))
        c_q = self.q_norm(q_low)
        q = self.q_up(c_q).view(tokens, heads, self.nope_dim + self.rope_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_rope = kv.split([self.latent_rank, self.rope_dim], dim=-1)
        w_uk, w_uv = self.absorbed_weights()
        q_absorbed, latent = self.query_latent(torch.einsum("thd,hdr->thr", q_nope, w_uk), q_rope, c_kv, k_rope,
                                               cos, sin)
        q_index, k_index, index_weights = self.fused_indexer_inputs(c_q, index_k, index_w, meta)
        attention.write(cache, latent, k_index, meta)
        o_latent = attention.attend(cache, q_index, index_weights, q_absorbed, meta, self.topk, self.softmax_scale)
        o = torch.einsum("thr,hvr->thv", o_latent.to(x.dtype), w_uv)
        return self.o_proj(o.reshape(tokens, heads * self.v_dim))

    def query_latent(self, q_nope_absorbed: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor,
                     k_rope: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(absorbed query ``[T, H, 576]`` = ``[W_UKᵀ q_nope, RoPE(q_rope)]``, latent ``[T, 576]`` = ``[RMSNorm(c_kv),
        RoPE(k_rope)]``) from q_nope_absorbed ``[T, H, 512]``, q_rope ``[T, H, 64]``, c_kv ``[T, 512]``, k_rope
        ``[T, 64]``: the query's and the key's RoPE in one rotation (the key as one more head); all of it one
        kernel with the fused kernels on (:func:`dsahal.model.fused.mla_query_latent`)."""
        heads = q_rope.shape[1]
        norm = self.kv_norm
        if (fused.active(q_rope, q_nope_absorbed, c_kv, k_rope, norm.weight, cos)
                and fused.mla_inputs_ok(q_nope_absorbed, q_rope, c_kv, k_rope, cos)):
            return fused.mla_query_latent(q_nope_absorbed, q_rope, c_kv, k_rope, norm.weight, norm.eps, cos, sin,
                                          self.rope.layout == "interleaved")
        roped = self.rope.apply(torch.cat([q_rope, k_rope[:, None]], dim=1), cos, sin)  # [T, H + 1, 64]
        q_absorbed = torch.cat([q_nope_absorbed, roped[:, :heads]], dim=-1)
        return q_absorbed, torch.cat([self.kv_norm(c_kv), roped[:, heads]], dim=-1)

    @staticmethod
    def cos_sin(rope, meta: BatchMeta) -> tuple[torch.Tensor, torch.Tensor]:
        """``rope``'s cos and sin ``[T, dim/2]`` for ``meta.positions``, shared by every layer and rope of the
        same frequencies in this step."""
        return meta.once(rope.angles_key, lambda: rope.cos_sin(meta.positions))

    def fused_indexer_inputs(self, c_q: torch.Tensor, index_k: torch.Tensor, index_w: torch.Tensor,
                             meta: BatchMeta):
        """:meth:`indexer_inputs` from ``c_q``, ``index_k_proj(x)`` and ``index_weights_proj(x)``, with the query's
        heads and the shared key rotated together (RoPE on their first 64 dims, then the Hadamard rotation: both
        act on each head alone, so stacking the key as head ``Hi`` changes no value)."""
        tokens, heads = c_q.shape[0], self.index_heads
        cos, sin = self.cos_sin(self.index_rope, meta)
        q = self.index_q_up(c_q).view(tokens, heads, self.index_dim)
        norm = self.index_k_norm
        if (norm.weight is not None and norm.bias is not None
                and fused.active(q, index_k, index_w, norm.weight, norm.bias, cos)
                and fused.indexer_inputs_ok(q, index_k, index_w, cos)):
            # one kernel (dsahal.model.fused): LayerNorm, RoPE, rotation, the query's FP8 quantisation, head weights
            return fused.indexer_inputs(q, index_k, norm.weight, norm.bias, norm.eps, cos, sin,
                                        self.index_rope.layout == "interleaved", index_w, fp8=self.index_query_fp8,
                                        scale_fmt=self.index_scale_fmt)
        qk = torch.cat([q, self.index_k_norm(index_k)[:, None]], dim=1)  # [T, Hi + 1, 128]
        qk = torch.cat([self.index_rope.apply(qk[..., :INDEX_ROPE_DIM], cos, sin), qk[..., INDEX_ROPE_DIM:]], dim=-1)
        qk = hadamard_rotate(qk)
        q_index, weights = index_query_and_weights(qk[:, :heads], index_w, rotated=True,
                                                   fp8=self.index_query_fp8, scale_fmt=self.index_scale_fmt)
        return q_index, qk[:, heads], weights
