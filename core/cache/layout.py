"""The row layout of the packed KV cache, derived from a model config, two formats and a parallel layout.

One *row* of the pool holds one block (``block_tokens`` tokens) of every DSA layer's latent page and
index-key page, back to back::

    row = [L0 latent page][L0 index page][L1 latent page][L1 index page] ... [padding to row_bytes]

A page is ``block_tokens * token_bytes`` bytes, its start rounded up to :data:`PAGE_ALIGN`. The row
is rounded up to :data:`PAGE_ALIGN` (``row_rounding="page"``, the default: every page and state still
starts on a 256-byte boundary, which is what vector loads, TMA and DMA need) or, on request, to a
power of two (``"pow2"``: for an allocator or a transfer engine that requires power-of-two buffers;
for the real formats it pads rows by 29-48%). ``docs/cache.md`` has the figures. A request's KDA state (every KDA
layer, this device's heads) fills ``rows_per_state`` consecutive rows of the same pool, each KDA layer's
recurrent state followed by its short-convolution state (the last ``kernel - 1`` inputs of every q, k
and v channel of the layer's causal depthwise convolution, see :mod:`dsahal.model.kda_layer`)::

    state = [KDA layer 0: H_local x K x V fp32][layer 0 conv: 3 x (kernel - 1) x H_local*K fp32]
            [KDA layer 1] ... [padding to rows_per_state * row_bytes]

Each starts on a :data:`PAGE_ALIGN` boundary; a layer's conv state starts at
:func:`conv_state_offset` of its recurrent state, so it can be found from the recurrent view alone.

Sharding. Tensor parallelism (``tp``) divides KDA heads, so the state per device shrinks by ``tp``;
the MLA latent and index key are shared by all heads, so TP replicates them. Decode context
parallelism (``dcp = W``) stores every W-th token on each rank: a rank's block holds
``block_tokens`` of *its* tokens, so per-device bytes per (global) token shrink by W.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..formats import index_format, latent_format

PAGE_ALIGN = 256  # bytes; every page and state starts on this boundary (vector loads, TMA, DMA)
FP32_BYTES = 4
KDA_CONV_KERNEL = 4  # fla's KDA short convolution (conv_size); a config's ``kda_conv_size`` overrides it
KDA_CONV_PROJECTIONS = 3  # q, k and v each have their own convolution
ROW_ROUNDINGS = ("page", "pow2")
MAX_SLOTS = 2**31  # slots (block * block_tokens + offset) are int32 in every op and kernel
DEFAULT_ROW_ROUNDING = "page"  # pow2 padded rows by 29-48% for the seed's formats (docs/cache.md, issue 20)


@dataclass(frozen=True)
class PageSpec:
    """One DSA layer's page of one kind inside a row: bytes ``[offset, offset + nbytes)``."""

    layer: int  # model layer index (a DSA layer)
    kind: str  # "latent" or "index"
    fmt: str
    offset: int
    nbytes: int
    token_bytes: int


@dataclass(frozen=True)
class StateSpec:
    """One KDA layer's state inside a state slot: fp32 ``[H_local, K, V]`` at byte ``offset``."""

    layer: int  # model layer index (a KDA layer)
    offset: int
    nbytes: int


def conv_state_offset(state_offset: int, state_nbytes: int) -> int:
    """Byte offset of a KDA layer's conv state: its recurrent state's (a PAGE_ALIGN multiple) plus the
    recurrent state's bytes rounded up to PAGE_ALIGN. A rule relative to the recurrent state, so the conv
    state is found from a recurrent-state view alone (:func:`dsahal.model.kda_layer.conv_state_view`)."""
    return state_offset + _round_up(state_nbytes, PAGE_ALIGN)


def kda_conv_kernel(config) -> int:
    """The KDA short convolution's kernel size of ``config`` (``kda_conv_size`` if it has the field)."""
    kernel = getattr(config, "kda_conv_size", KDA_CONV_KERNEL)
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1:
        raise ValueError(f"dsahal.cache: model config field 'kda_conv_size' expected an int >= 1, got {kernel!r}")
    return kernel


_MOVED_ACCOUNTING = frozenset({"row_padding_bytes", "payload_bytes_per_block", "recurrent_state_bytes",
                               "conv_state_bytes", "state_padding_bytes", "payload_bytes_per_token",
                               "row_bytes_per_token", "to_dict"})


@dataclass(frozen=True)
class CacheLayout:
    """Everything about where bytes live; produced by :func:`plan_layout`, consumed by
    :class:`~dsahal.cache.PackedKVCache` and the planner. All sizes are per device, in bytes."""

    def __getattr__(self, name: str):
        """The byte accounting that moved to the planner (``dsahal.cli.capacity.layout_report``): the old
        attributes and ``to_dict()`` still answer, with a deprecation warning (resolved by string: the contract
        imports no consumer)."""
        if name.startswith("__") or name not in _MOVED_ACCOUNTING:
            raise AttributeError(f"'CacheLayout' object has no attribute {name!r}")
        import importlib
        import warnings

        warnings.warn(f"CacheLayout.{name} is deprecated: use dsahal.cli.capacity.layout_report(layout)"
                      f"{'' if name == 'to_dict' else '[' + repr(name) + ']'}", DeprecationWarning, stacklevel=2)
        report = importlib.import_module("dsahal.cli.capacity").layout_report(self)
        return (lambda: report) if name == "to_dict" else report[name]

    model: str
    latent_fmt: str
    index_fmt: str
    block_tokens: int
    tp: int
    dcp: int
    row_rounding: str
    latent_token_bytes: int
    index_token_bytes: int
    pages: tuple[PageSpec, ...]
    row_data_bytes: int  # end of the last page
    row_bytes: int
    kda_heads_local: int
    kda_key_dim: int
    kda_value_dim: int
    states: tuple[StateSpec, ...]  # recurrent states
    state_bytes: int  # one request's KDA state on this device (all KDA layers, recurrent + conv)
    rows_per_state: int
    kda_conv_kernel: int = KDA_CONV_KERNEL
    conv_states: tuple[StateSpec, ...] = ()  # short-convolution states, one per KDA layer (same order)

    # -- lookups -----------------------------------------------------------------------------------
    @property
    def dsa_layers(self) -> tuple[int, ...]:
        return tuple(p.layer for p in self.pages if p.kind == "latent")

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(s.layer for s in self.states)

    def page(self, layer: int, kind: str) -> PageSpec:
        if kind not in ("latent", "index"):  # else the search finds no page and blames the layer
            raise ValueError(f"dsahal.cache: argument 'kind' expected 'latent' or 'index', got {kind!r}")
        return self._find((p for p in self.pages if p.kind == kind), layer, "DSA", self.dsa_layers)

    def state(self, layer: int) -> StateSpec:
        return self._find(self.states, layer, "KDA", self.kda_layers)

    def conv_state(self, layer: int) -> StateSpec:
        return self._find(self.conv_states, layer, "KDA", self.kda_layers)

    def _find(self, specs, layer: int, what: str, layers: tuple[int, ...]):
        for spec in specs:
            if spec.layer == layer:
                return spec
        raise ValueError(f"dsahal.cache: layer {layer!r} is not a {what} layer of {self.model!r}; "
                         f"{what} layers are {list(layers)}")

    # -- derived sizes (the planner's byte accounting is dsahal.cli.capacity.layout_report) -----------
    @property
    def num_dsa_layers(self) -> int:
        return len(self.dsa_layers)

    @property
    def kda_layer_state_bytes(self) -> int:
        return self.kda_heads_local * self.kda_key_dim * self.kda_value_dim * FP32_BYTES

    @property
    def kda_conv_channels(self) -> int:
        """Channels of one of a KDA layer's three convolutions on this device: ``H_local * K``."""
        return self.kda_heads_local * self.kda_key_dim

    @property
    def kda_layer_conv_bytes(self) -> int:
        """One KDA layer's conv state of one request: ``3 x (kernel - 1) x H_local*K`` fp32."""
        return KDA_CONV_PROJECTIONS * (self.kda_conv_kernel - 1) * self.kda_conv_channels * FP32_BYTES

    @property
    def state_slot_bytes(self) -> int:
        return self.rows_per_state * self.row_bytes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def next_power_of_two(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"dsahal.cache.plan_layout: argument '{name}' expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"dsahal.cache.plan_layout: argument '{name}' expected an int >= 1, got {value}")
    return value


def plan_layout(
    config: ModelConfig,
    *,
    latent_fmt: str = "bf16",
    index_fmt: str = "fp8",
    block_tokens: int = 64,
    tp: int = 1,
    dcp: int = 1,
    row_rounding: str = DEFAULT_ROW_ROUNDING,
) -> CacheLayout:
    """The packed row layout of ``config`` on one device.

    Args:
        config: the model (its DSA layers get pages, its KDA layers get a recurrent and a conv state).
        latent_fmt / index_fmt: format names of :mod:`dsahal.formats`.
        block_tokens: tokens per block (per rank under DCP).
        tp: tensor-parallel size; must divide the KDA heads (and the attention heads).
        dcp: decode-context-parallel size: each rank stores every ``dcp``-th token.
        row_rounding: ``"page"`` (default: row bytes a multiple of PAGE_ALIGN) or ``"pow2"`` (a power of
            two, for consumers that need power-of-two buffers; costs the padding).

    Raises ``TypeError``/``ValueError`` naming the argument for bad input.
    """
    where = "dsahal.cache.plan_layout"
    if not isinstance(config, ModelConfig):
        raise TypeError(f"{where}: argument 'config' expected a ModelConfig, got {type(config).__name__}")
    block_tokens, tp, dcp = (_positive_int(n, v) for n, v in (("block_tokens", block_tokens), ("tp", tp),
                                                              ("dcp", dcp)))
    if block_tokens > MAX_SLOTS:  # one block's slots must already be int32 ids
        raise ValueError(f"{where}: argument 'block_tokens' expected an int <= {MAX_SLOTS} (slots are int32), "
                         f"got {block_tokens}")
    try:
        latent, index = latent_format(latent_fmt), index_format(index_fmt)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if row_rounding not in ROW_ROUNDINGS:
        raise ValueError(f"{where}: argument 'row_rounding' expected one of {list(ROW_ROUNDINGS)}, "
                         f"got {row_rounding!r}")
    if not config.dsa_layers:
        raise ValueError(f"{where}: config {config.name!r} has no DSA layer; the packed cache pages DSA layers")
    for heads_name, heads in (("kda heads", config.kda_num_heads), ("attention heads", config.num_heads)):
        if heads % tp:
            raise ValueError(f"{where}: argument 'tp' expected a divisor of the {heads_name} ({heads}), got {tp}")

    pages, offset = [], 0
    for layer in config.dsa_layers:
        for kind, spec in (("latent", latent), ("index", index)):
            offset = _round_up(offset, PAGE_ALIGN)
            nbytes = block_tokens * spec.token_bytes
            pages.append(PageSpec(layer, kind, spec.name, offset, nbytes, spec.token_bytes))
            offset += nbytes
    row_data_bytes = offset
    aligned = _round_up(row_data_bytes, PAGE_ALIGN)
    row_bytes = next_power_of_two(aligned) if row_rounding == "pow2" else aligned

    heads_local = config.kda_num_heads // tp
    key_dim = value_dim = config.kda_head_dim
    kernel = kda_conv_kernel(config)
    layer_state = heads_local * key_dim * value_dim * FP32_BYTES
    layer_conv = KDA_CONV_PROJECTIONS * (kernel - 1) * heads_local * key_dim * FP32_BYTES
    states, convs, offset = [], [], 0
    for layer in config.kda_layers:
        offset = _round_up(offset, PAGE_ALIGN)
        states.append(StateSpec(layer, offset, layer_state))
        offset = conv_state_offset(offset, layer_state)
        convs.append(StateSpec(layer, offset, layer_conv))
        offset += layer_conv
    state_bytes = offset
    rows_per_state = -(-state_bytes // row_bytes)

    return CacheLayout(
        model=config.name, latent_fmt=latent.name, index_fmt=index.name, block_tokens=block_tokens, tp=tp, dcp=dcp,
        row_rounding=row_rounding, latent_token_bytes=latent.token_bytes, index_token_bytes=index.token_bytes,
        pages=tuple(pages), row_data_bytes=row_data_bytes, row_bytes=row_bytes, kda_heads_local=heads_local,
        kda_key_dim=key_dim, kda_value_dim=value_dim, states=tuple(states), state_bytes=state_bytes,
        rows_per_state=rows_per_state, kda_conv_kernel=kernel, conv_states=tuple(convs),
    )
