"""The model's weight memory per device, from the config alone: what ``dsahal plan`` subtracts from a
device's memory to find the KV cache budget left.

Every parameter of the graph (:mod:`dsahal.model`) is listed as a matrix or vector with how it is
sharded, following DeepSeek-V3(.2)'s inference ``model.py``:

- TP (``tp``) splits by head or by width: embedding and LM head (vocab-parallel), MLA's ``q_up``,
  ``kv_up``, ``o_proj``, KDA's per-head projections, convolutions and gates, the dense MLP and the
  shared experts;
- EP (``ep``) deals the routed experts out: ``n_routed_experts / ep`` experts on each device;
- replicated: the low-rank down projections (``q_down``, ``kv_down``, KDA's gate and decay ``_down``),
  the indexer (its projections are not head-sharded), the MoE router, every norm.

A parameter count is exact (``tests/test_plan_weights.py`` checks it against the model built on the
meta device). Bytes per element by ``weights_dtype``: ``bf16`` 2, ``fp32`` 4; ``fp8`` stores the
linear weights (not the embedding, LM head, router or norms, which DeepSeek's FP8 checkpoints keep in
BF16) in 1 byte plus an fp32 scale per 128x128 block of each device's shard.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

WEIGHT_DTYPES = {"bf16": 2, "fp32": 4, "fp8": 1}
FP8_BLOCK = 128
PARTS = ("embeddings", "attention", "dense_mlp", "routed_experts", "shared_experts", "router", "norms")


@dataclass(frozen=True)
class Tensor:
    """One parameter (or ``count`` of that shape, per expert when ``experts``): ``shape`` whole; ``split``
    how a device holds it: ``"rep"``, ``"tp0"`` / ``"tp1"`` (dim 0 / dim 1 divided by tp), ``"ep"`` (the
    ``experts`` dealt out over ep)."""

    part: str
    shape: tuple[int, ...]
    split: str = "rep"
    count: int = 1
    quantisable: bool = True  # an FP8 checkpoint stores it in FP8 (linear weights only)
    experts: int = 1

    @property
    def copies(self) -> int:
        return self.count * self.experts


@dataclass(frozen=True)
class WeightMemory:
    """Parameters of the whole model and bytes per device, by part (:data:`PARTS`)."""

    weights_dtype: str
    tp: int
    ep: int
    parameters: int
    parameters_by_part: dict = field(default_factory=dict)
    device_bytes: int = 0
    device_bytes_by_part: dict = field(default_factory=dict)
    routed_experts_per_device: int = 0
    routed_experts_per_layer: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _linear(part: str, out: int, inp: int, split: str = "rep", count: int = 1, experts: int = 1) -> Tensor:
    return Tensor(part, (out, inp), split, count, experts=experts)


def _vector(part: str, n: int, split: str = "rep") -> Tensor:
    return Tensor(part, (n,), split, quantisable=False)


def _mla(config) -> list[Tensor]:
    d, h, qr, r = config.hidden_size, config.num_heads, config.q_lora_rank, config.kv_lora_rank
    nope, rope, v = config.qk_nope_dim, config.qk_rope_dim, config.v_head_dim
    hi, di = config.index_heads, config.index_dim
    a = "attention"
    return [_linear(a, qr, d), _vector(a, qr), _linear(a, h * (nope + rope), qr, "tp0"),
            _linear(a, r + rope, d), _vector(a, r), _linear(a, h * (nope + v), r, "tp0"),
            _linear(a, d, h * v, "tp1"),
            _linear(a, hi * di, qr), _linear(a, di, d), _vector(a, di), _vector(a, di), _linear(a, hi, d)]


def _kda(config) -> list[Tensor]:
    from ..cache.layout import kda_conv_kernel

    d, g = config.hidden_size, config.kda_gate_rank
    heads, width = config.kda_num_heads, config.kda_num_heads * config.kda_head_dim
    a = "attention"
    conv = Tensor(a, (width, kda_conv_kernel(config)), "tp0", count=3, quantisable=False)
    return [_linear(a, width, d, "tp0", count=3), conv,
            _linear(a, g, d), _linear(a, width, g, "tp0"), _vector(a, heads, "tp0"), _vector(a, width, "tp0"),
            _linear(a, heads, d, "tp0"), _linear(a, g, d), _linear(a, width, g, "tp0"), _vector(a, width, "tp0"),
            _vector(a, config.kda_head_dim), _linear(a, d, width, "tp1")]


def _swiglu(part: str, d: int, width: int, experts: int = 0) -> list[Tensor]:
    """gate, up ``[width, d]`` and down ``[d, width]``: TP splits the width, or (``experts`` > 0) EP deals
    out that many experts."""
    if experts:
        return [_linear(part, width, d, "ep", 2, experts), _linear(part, d, width, "ep", 1, experts)]
    return [_linear(part, width, d, "tp0", 2), _linear(part, d, width, "tp1")]


def model_tensors(config) -> list[Tensor]:
    """Every parameter of the graph ``config`` describes (``dsahal.model.HybridModel``)."""
    d, vocab = config.hidden_size, config.vocab_size
    tensors = [Tensor("embeddings", (vocab, d), "tp0", quantisable=False)]
    if not getattr(config, "tie_embeddings", False):
        tensors.append(Tensor("embeddings", (vocab, d), "tp0", quantisable=False))
    tensors.append(_vector("norms", d))
    for index, kind in enumerate(config.layer_kinds):
        tensors += [_vector("norms", d), _vector("norms", d)]
        tensors += _mla(config) if kind == "dsa" else _kda(config)
        if config.is_moe_layer(index):
            experts = config.n_routed_experts
            tensors += [Tensor("router", (experts, d), quantisable=False), _vector("router", experts)]
            tensors += _swiglu("routed_experts", d, config.moe_intermediate_size, experts)
            if config.n_shared_experts:
                tensors += _swiglu("shared_experts", d, config.moe_intermediate_size * config.n_shared_experts)
        else:
            tensors += _swiglu("dense_mlp", d, config.intermediate_size)
    return tensors


def _shard_shape(tensor: Tensor, tp: int, ep: int) -> tuple[tuple[int, ...], int]:
    """(shape, copies) one device holds; a dimension that ``tp`` does not divide rounds up (padding)."""
    shape = list(tensor.shape)
    if tensor.split in ("tp0", "tp1"):
        dim = 0 if tensor.split == "tp0" else 1
        shape[dim] = math.ceil(shape[dim] / tp)
    if tensor.split == "ep":
        return tuple(shape), tensor.count * math.ceil(tensor.experts / ep)
    return tuple(shape), tensor.copies


def _bytes(shape: tuple[int, ...], weights_dtype: str, quantisable: bool) -> int:
    elements = math.prod(shape)
    if weights_dtype != "fp8" or not quantisable or len(shape) != 2:
        return elements * (WEIGHT_DTYPES["bf16"] if weights_dtype == "fp8" else WEIGHT_DTYPES[weights_dtype])
    blocks = math.ceil(shape[0] / FP8_BLOCK) * math.ceil(shape[1] / FP8_BLOCK)
    return elements + 4 * blocks  # e4m3 values + one fp32 scale_inv per 128x128 block


def weight_memory(config, *, tp: int = 1, ep: int = 1, weights_dtype: str = "bf16") -> WeightMemory:
    """The weights of ``config`` on one device of a TP ``tp`` x EP ``ep`` layout.

    Raises ``ValueError`` naming the argument: ``weights_dtype`` not in :data:`WEIGHT_DTYPES`, ``ep`` not
    dividing the routed experts, ``tp`` or ``ep`` below 1."""
    where = "dsahal.cache.weight_memory"
    if weights_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"{where}: argument 'weights_dtype' expected one of {list(WEIGHT_DTYPES)}, "
                         f"got {weights_dtype!r}")
    for name, value in (("tp", tp), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: argument '{name}' expected an int >= 1, got {value!r}")
    experts = config.n_routed_experts if config.moe_layers else 0
    if ep > 1 and (not experts or experts % ep):
        raise ValueError(f"{where}: argument 'ep' expected a divisor of the routed experts of {config.name} "
                         f"({experts}), got {ep}" + ("" if experts else " (the model has no MoE layers)"))
    params = dict.fromkeys(PARTS, 0)
    device = dict.fromkeys(PARTS, 0)
    for tensor in model_tensors(config):
        params[tensor.part] += math.prod(tensor.shape) * tensor.copies
        shape, count = _shard_shape(tensor, tp, ep)
        device[tensor.part] += _bytes(shape, weights_dtype, tensor.quantisable) * count
    return WeightMemory(weights_dtype=weights_dtype, tp=tp, ep=ep, parameters=sum(params.values()),
                        parameters_by_part=params, device_bytes=sum(device.values()), device_bytes_by_part=device,
                        routed_experts_per_device=experts // ep if experts else 0, routed_experts_per_layer=experts)
