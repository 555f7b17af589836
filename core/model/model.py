"""The hybrid model: embeddings, pre-norm blocks of (KDA or MLA+DSA attention, dense SwiGLU MLP or MoE), LM head.

It never imports a backend: attention runs through :mod:`dsahal.ops` (via the layers and the
:class:`~dsahal.model.dsa_attention.DsaAttention` object), everything else is plain torch.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from .batch import BatchMeta, ModelCache
from .dsa_attention import DsaAttention, LocalDsaAttention
from .kda_layer import KdaLayer
from .layers import RMSNorm, SwiGLU
from .mla_layer import INDEX_ROPE_DIM, MlaLayer
from .moe import MoE


def validate_model_config(config) -> None:
    """What the model graph needs of a config beyond :class:`~dsahal.config.ModelConfig`'s own checks.

    Raises ``ValueError`` naming the field, what was expected and what was given.
    """
    def fail(field: str, expected: str) -> None:
        raise ValueError(f"HybridModel: config {config.name!r} field '{field}' expected {expected}, "
                         f"got {getattr(config, field)!r}")

    if not config.layer_kinds:
        fail("layer_kinds", "at least one layer")
    for field in ("q_lora_rank", "qk_nope_dim", "v_head_dim", "kda_gate_rank"):
        if getattr(config, field) <= 0:
            fail(field, "an int > 0")
    if config.qk_rope_dim % 2:
        fail("qk_rope_dim", "an even number (RoPE rotates pairs)")
    if config.index_dim < INDEX_ROPE_DIM:
        fail("index_dim", f">= {INDEX_ROPE_DIM} (the indexer's RoPE dims)")
    # Finite as well as positive: rope_theta = inf ran with every rotation but the first pair's frozen, and
    # mscale 0 / nan reached dsa_attention as a bad softmax_scale (a negative one was squared away silently).
    if not 0 < config.rope_theta < math.inf:
        fail("rope_theta", "a finite number > 0")
    if not 0 < config.rms_norm_eps < math.inf:
        fail("rms_norm_eps", "a finite number > 0")
    if not 0 < config.mscale < math.inf:
        fail("mscale", "a finite number > 0 (the softmax scale's factor is mscale squared)")


def make_mlp(config, index: int) -> nn.Module:
    """Layer ``index``'s MLP: :class:`~dsahal.model.moe.MoE` where the config routes experts
    (``config.is_moe_layer``), else the dense SwiGLU of ``intermediate_size``."""
    if config.is_moe_layer(index):
        return MoE(config)
    return SwiGLU(config.hidden_size, config.intermediate_size)


class Block(nn.Module):
    """``x + attn(norm(x))`` then ``x + mlp(norm(x))``; ``attn`` is KDA or MLA+DSA by ``kind``, ``mlp``
    dense or MoE by the layer's ``index``."""

    def __init__(self, config, kind: str, index: int = 0):
        super().__init__()
        self.kind = kind
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = KdaLayer(config) if kind == "kda" else MlaLayer(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = make_mlp(config, index)

    def forward(self, x, meta: BatchMeta, layer_cache, attention: DsaAttention, check: bool) -> torch.Tensor:
        h = self.attn_norm(x)
        if self.kind == "kda":
            h = self.attn(h, meta, layer_cache, check=check)
        else:
            h = self.attn(h, meta, layer_cache, attention)
        h, x = self.mlp_norm(x, h)  # x + h and its norm: one kernel with the fused kernels on (RMSNorm.forward)
        return x + self.mlp(h)


class HybridModel(nn.Module):
    """A hybrid KDA + DSA decoder built from a :class:`dsahal.config.ModelConfig`.

    Args:
        config: the model's shape; ``layer_kinds`` fixes the layer order.
        attention: how DSA layers write and attend (default :class:`LocalDsaAttention`); the engine
            may swap it (e.g. for decode context parallelism) with :meth:`set_attention`.
        check_ops: validate every op call's arguments (KDA layers; DSA layers follow ``attention.check``).

    Parameters are created uninitialised-but-deterministic (torch defaults); call
    :func:`dsahal.model.init_weights` or :func:`dsahal.model.load_weights`.
    """

    def __init__(self, config, attention: Optional[DsaAttention] = None, check_ops: bool = True):
        super().__init__()
        validate_model_config(config)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config, kind, index) for index, kind in enumerate(config.layer_kinds))
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.attention: DsaAttention = attention or LocalDsaAttention()
        self.check_ops = check_ops

    def set_attention(self, attention: DsaAttention) -> None:
        self.attention = attention

    def forward(self, token_ids: torch.Tensor, meta: BatchMeta, cache: ModelCache,
                logits_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One step over a packed batch.

        Args:
            token_ids: ``[T]`` int64 token ids, packed as ``meta`` describes.
            meta: the batch metadata (positions, block table, write slots, KDA sequences).
            cache: the per-layer cache views; the step writes every token's latent, index key and
                KDA state into it.
            logits_indices: ``[N]`` int64 tokens whose logits to compute (default all ``T``).

        Returns:
            ``[N, vocab]`` fp32 logits.
        """
        meta.derived.clear()  # what the layers share in this step is derived from this step's tensors
        x = self.embed(token_ids)
        for index, block in enumerate(self.blocks):
            x = block(x, meta, cache.layer(index), self.attention, self.check_ops)
        if logits_indices is not None:
            x = x.index_select(0, logits_indices)
        return self.lm_head(self.final_norm(x)).float()

    def step(self, token_ids: torch.Tensor, positions: torch.Tensor, req_ids: torch.Tensor, block_table: torch.Tensor,
             slots: torch.Tensor, cu_seqlens: torch.Tensor, state_ids: torch.Tensor, cache: ModelCache, *,
             max_context: int, decode: bool, logits_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
        """:meth:`forward` with the metadata as loose tensors: the form to hand to ``torch.compile``."""
        meta = BatchMeta(positions, req_ids, block_table, slots, cu_seqlens, state_ids, max_context, decode)
        return self.forward(token_ids, meta, cache, logits_indices)
