"""Capacity planning for ``dsahal plan`` (and the multi-GPU bench's capacity section): tokens and full
contexts that fit a memory budget, from first principles. A consumer of the cache's row layout
(:func:`dsahal.cache.plan_layout`), not part of the contract: it moved here from ``dsahal.cache``.

Only the layout's byte counts and the sharding rules are used (no measured constants):

- tokens that fit (per TP/DCP group) = ``floor(budget / row_bytes) * block_tokens * dcp``: every row
  a block, each rank holding a 1/dcp share of every context;
- a full context of N tokens needs, per device, ``ceil(ceil(N / dcp) / block_tokens)`` rows of blocks
  plus ``rows_per_state`` rows of KDA state (recurrent and short-conv, every KDA layer); contexts that fit = ``floor(rows / that)`` (states are
  packed at the bottom of the pool and blocks above them, so the count is achievable);
- a *per-layer padded* layout (every layer's pages in their own pool, padded to one common page
  size, as a uniform-page hybrid allocator does) is sized for comparison: see :func:`padded_layouts`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..cache import CacheLayout, plan_layout
from ..config import ModelConfig


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# -- the layout's byte accounting -----------------------------------------------------------------
def payload_bytes_per_block(layout: CacheLayout) -> int:
    """Bytes of one block's pages, without any alignment: ``block_tokens * DSA layers * (latent + index
    token bytes)``."""
    return layout.block_tokens * layout.num_dsa_layers * (layout.latent_token_bytes + layout.index_token_bytes)


def payload_bytes_per_token(layout: CacheLayout) -> float:
    """Per device, per token of the whole context: ``DSA layers * (latent + index token bytes) / dcp``."""
    return layout.num_dsa_layers * (layout.latent_token_bytes + layout.index_token_bytes) / layout.dcp


def row_bytes_per_token(layout: CacheLayout) -> float:
    """Per device, per token of the whole context, as laid out (row padding included)."""
    return layout.row_bytes / (layout.block_tokens * layout.dcp)


def layout_report(layout: CacheLayout) -> dict:
    """``layout``'s fields and its byte accounting, for ``dsahal plan``: the row's padding (alignment and
    rounding to ``row_bytes``), a state's split into recurrent and short-conv bytes (every KDA layer,
    unaligned) and its slot's padding, and the bytes per context token."""
    return asdict(layout) | dict(
        row_padding_bytes=layout.row_bytes - payload_bytes_per_block(layout),
        payload_bytes_per_block=payload_bytes_per_block(layout),
        kda_layer_state_bytes=layout.kda_layer_state_bytes, kda_conv_channels=layout.kda_conv_channels,
        kda_layer_conv_bytes=layout.kda_layer_conv_bytes,
        recurrent_state_bytes=len(layout.states) * layout.kda_layer_state_bytes,
        conv_state_bytes=len(layout.conv_states) * layout.kda_layer_conv_bytes,
        state_slot_bytes=layout.state_slot_bytes, state_padding_bytes=layout.state_slot_bytes - layout.state_bytes,
        payload_bytes_per_token=payload_bytes_per_token(layout), row_bytes_per_token=row_bytes_per_token(layout),
    )


@dataclass(frozen=True)
class Capacity:
    """What fits on each device of a TP/DCP group with ``budget_bytes`` of cache memory per device."""

    budget_bytes: int
    context_tokens: int
    rows: int
    tokens: int  # whole-context tokens the group holds (every row a block)
    tokens_per_device: int  # tokens each device stores (= tokens / dcp)
    blocks_per_context: int  # per device
    rows_per_context: int  # blocks + one KDA state
    full_contexts: int
    payload_bytes_per_token: float  # per device, per context token
    row_bytes_per_token: float  # per device, per context token, row padding included
    state_bytes_per_context: int  # one KDA state slot, per device

    def to_dict(self) -> dict:
        return asdict(self)


def capacity(layout: CacheLayout, budget_bytes: int, context_tokens: int) -> Capacity:
    """Tokens and full contexts of ``context_tokens`` that ``budget_bytes`` per device holds."""
    for name, value in (("budget_bytes", budget_bytes), ("context_tokens", context_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"dsahal.cli.capacity.capacity: argument '{name}' expected an int >= 1, got {value!r}")
    rows = budget_bytes // layout.row_bytes
    blocks_per_context = _ceil_div(_ceil_div(context_tokens, layout.dcp), layout.block_tokens)
    rows_per_context = blocks_per_context + layout.rows_per_state
    tokens_per_device = rows * layout.block_tokens
    return Capacity(
        budget_bytes=budget_bytes, context_tokens=context_tokens, rows=rows,
        tokens=tokens_per_device * layout.dcp, tokens_per_device=tokens_per_device,
        blocks_per_context=blocks_per_context, rows_per_context=rows_per_context,
        full_contexts=rows // rows_per_context,
        payload_bytes_per_token=payload_bytes_per_token(layout), row_bytes_per_token=row_bytes_per_token(layout),
        state_bytes_per_context=layout.state_slot_bytes,
    )


@dataclass(frozen=True)
class PaddedLayout:
    """A per-layer layout where every page is padded to ``page_bytes`` (for comparison only)."""

    name: str
    description: str
    page_bytes: int
    bytes_per_block: int  # all DSA layers' latent + index pages of one block
    waste_fraction: float  # of bytes_per_block, versus the unpadded payload
    tokens: int  # whole-context tokens the group holds in the same budget
    full_contexts: int

    def to_dict(self) -> dict:
        return asdict(self)


def padded_layouts(layout: CacheLayout, budget_bytes: int, context_tokens: int) -> list[PaddedLayout]:
    """Two per-layer padded layouts of the same model, formats, block size and budget.

    - ``widest-token-page``: each DSA layer keeps separate latent and index pages, both padded to the
      wider of the two (the index page is padded up to the latent page).
    - ``uniform-page``: one page size for every layer of the model, large enough for a KDA layer's
      state of one request, recurrent and conv together (a uniform-page hybrid allocator); a
      request's state takes one page per KDA layer, a block one page per DSA layer and kind.
    """
    n_dsa, n_kda = layout.num_dsa_layers, len(layout.states)
    latent_page = layout.block_tokens * layout.latent_token_bytes
    index_page = layout.block_tokens * layout.index_token_bytes
    payload = payload_bytes_per_block(layout)
    layer_state = layout.kda_layer_state_bytes + layout.kda_layer_conv_bytes  # one KDA layer, one request
    context_blocks = _ceil_div(_ceil_div(context_tokens, layout.dcp), layout.block_tokens)
    result = []
    for name, description, page, state_cost in (
        ("widest-token-page", "index pages padded to the latent page; KDA states stored unpadded",
         max(latent_page, index_page), layout.state_bytes),
        ("uniform-page", "every layer's page padded to the largest of latent page, index page and one KDA "
         "layer's state (recurrent + conv)", max(latent_page, index_page, layer_state),
         n_kda * max(latent_page, index_page, layer_state)),
    ):
        per_block = 2 * n_dsa * page
        blocks = budget_bytes // per_block
        context_bytes = context_blocks * per_block + state_cost
        result.append(PaddedLayout(
            name=name, description=description, page_bytes=page, bytes_per_block=per_block,
            waste_fraction=1.0 - payload / per_block, tokens=blocks * layout.block_tokens * layout.dcp,
            full_contexts=budget_bytes // context_bytes,
        ))
    return result


@dataclass(frozen=True)
class Comparison:
    """Capacity of the planned layout against a baseline layout at the same budget and context."""

    name: str
    baseline: str
    tokens_ratio: float  # as laid out (row rounding included)
    payload_ratio: float  # bytes per token only (no row rounding)
    contexts: tuple[int, int]  # (baseline, planned)
    tokens: tuple[int, int]

    def to_dict(self) -> dict:
        return asdict(self)


def _describe(layout: CacheLayout) -> str:
    return f"{layout.latent_fmt}+{layout.index_fmt} TP{layout.tp}" + (f" DCP{layout.dcp}" if layout.dcp > 1 else "")


def compare(config: ModelConfig, layout: CacheLayout, budget_bytes: int, context_tokens: int,
            baseline_kwargs: dict) -> Comparison:
    """Compare ``layout`` with the layout of ``config`` that differs by ``baseline_kwargs``."""
    kwargs = dict(latent_fmt=layout.latent_fmt, index_fmt=layout.index_fmt, block_tokens=layout.block_tokens,
                  tp=layout.tp, dcp=layout.dcp, row_rounding=layout.row_rounding)
    kwargs.update(baseline_kwargs)
    base_layout = plan_layout(config, **kwargs)
    base, mine = capacity(base_layout, budget_bytes, context_tokens), capacity(layout, budget_bytes, context_tokens)
    return Comparison(
        name=f"{_describe(layout)} vs {_describe(base_layout)}", baseline=_describe(base_layout),
        tokens_ratio=mine.tokens / base.tokens if base.tokens else float("inf"),
        payload_ratio=base.payload_bytes_per_token / mine.payload_bytes_per_token,
        contexts=(base.full_contexts, mine.full_contexts), tokens=(base.tokens, mine.tokens),
    )


def standard_comparisons(config: ModelConfig, layout: CacheLayout, budget_bytes: int,
                         context_tokens: int) -> list[Comparison]:
    """The seed's two headline comparisons, for the planned layout: its formats against FP8 latent + FP8
    index keys (same parallel layout), and its DCP against no DCP (same formats, same TP); plus the
    product of both (the planned layout against FP8 without DCP)."""
    result = []
    fp8 = dict(latent_fmt="fp8", index_fmt="fp8")
    if (layout.latent_fmt, layout.index_fmt) != ("fp8", "fp8"):
        result.append(compare(config, layout, budget_bytes, context_tokens, fp8))
    if layout.dcp > 1:
        result.append(compare(config, layout, budget_bytes, context_tokens, dict(dcp=1)))
        if (layout.latent_fmt, layout.index_fmt) != ("fp8", "fp8"):
            result.append(compare(config, layout, budget_bytes, context_tokens, dict(fp8, dcp=1)))
    return result
