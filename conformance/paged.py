"""Cases of the ops that read or write a paged cache, and the guarded page pools they use.

Pages are always a view into a larger random-byte pool, in one of two layouts (a case's ``layout``):

- ``"records"``: ``lead``/``trail`` guard bytes around every record (which also makes the view
  non-contiguous) and whole guard blocks before and after; ``stride(0) = block_tokens * stride(1)``.
- ``"packed"``: one DSA layer's pages of a real :class:`dsahal.cache.PackedKVCache`, whose row pool
  holds a block of *every* layer's latent and index pages per row: ``stride(0) = row_bytes``,
  records back to back inside a block, other layers' pages on both sides of each block's page, and
  one guard row before and after. A kernel that addresses slot ``s`` at ``s * stride(1)`` (pages
  "as if contiguous") passes every records case and corrupts the other layers here.

Slots nobody writes keep random bytes, which decode to garbage (possibly NaN), so a backend that
reads a slot it should not is caught; whatever the page view does not cover must never change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from dsahal.conformance.cases import DTYPES, INDEX_DTYPES, Case, fused_slice, generator, rand, randn, strided_copy
from dsahal.formats import INDEX_DIM, LATENT_DIM, cache_format

REGIMES = ("normal", "wide", "limit", "tiny", "outlier")
LAYOUTS = ("records", "packed")
# The packed pool's other page, for cases that hold one kind: a DSA layer pages both kinds.
OTHER_FORMAT = {"latent": "fp8", "index": "bf16"}  # index format beside a latent page, and vice versa
FP8_LIMIT = 448.0  # e4m3's largest finite value: the "limit" regime puts token maxima exactly there


def format_limit(spec) -> float:
    """Largest magnitude a tensor-scaled format stores at scale 1 (saturating pack), else FP8's."""
    if not spec.needs_tensor_scale:
        return FP8_LIMIT
    big = torch.full((1, spec.dim), 1e30)
    one = torch.ones(())
    limit = float(spec.unpack(spec.pack(big, one), one).abs().max())
    return limit if math.isfinite(limit) and limit > 0 else FP8_LIMIT


def token_values(spec, count: int, regime: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``[count, dim]`` fp32 values in a magnitude regime, and the tensor scale the format needs.

    ``limit``: every token's largest magnitude is exactly 448 (FP8's limit; for a tensor-scaled
    format the scale maps the tensor's maximum exactly onto the format's limit). ``tiny``: 1e-3
    magnitudes (subnormal territory once scaled). ``outlier``: one element per token 1000x the rest
    (stresses block scales). ``wide``: per-token magnitudes from 1e-3 to 1e3.
    """
    values = randn(gen, count, spec.dim)
    if regime == "wide":
        values = values * torch.pow(10.0, 6 * rand(gen, count, 1) - 3)
    elif regime == "limit":
        values = values / values.abs().amax(dim=1, keepdim=True).clamp_min(1e-6) * FP8_LIMIT
    elif regime == "tiny":
        values = values * 1e-3
    elif regime == "outlier":
        column = torch.randint(0, spec.dim, (count,), generator=gen)
        values[torch.arange(count), column] *= 1000.0
    scale = None
    if spec.needs_tensor_scale:
        amax = float(values.abs().max()) if values.numel() else 1.0
        scale = torch.tensor(1.0 if regime == "tiny" else max(amax, 1e-6) / format_limit(spec))
    return values, scale


@dataclass
class GuardedPages:
    """``pages`` ``[num_blocks, block_tokens, token_bytes]`` is a view into ``pool`` (uint8, any
    shape, contiguous): ``[num_blocks + 2 * guard_blocks, block_tokens, lead + token_bytes + trail]``
    in the records layout, the packed cache's ``[rows, row_bytes]`` in the packed one. ``lead``:
    bytes before each record (records) or the page's offset in its row (packed)."""

    pool: torch.Tensor
    pages: torch.Tensor
    lead: int
    guard_blocks: int

    def _record_start(self, slot: int) -> int:
        """Offset of slot ``slot``'s first byte in the flattened pool, from the view's strides."""
        block, offset = divmod(slot, self.pages.shape[1])
        base = self.pages.storage_offset() - self.pool.storage_offset()
        return base + block * self.pages.stride(0) + offset * self.pages.stride(1)

    def record_mask(self, slots: torch.Tensor) -> torch.Tensor:
        """Bool mask over ``pool`` covering the records of ``slots`` (entries < 0 ignored), CPU."""
        mask = torch.zeros(self.pool.numel(), dtype=torch.bool)
        token_bytes = self.pages.shape[2]
        for slot in slots.reshape(-1).tolist():
            if slot >= 0:
                start = self._record_start(slot)
                mask[start: start + token_bytes] = True
        return mask.reshape(self.pool.shape)

    def describe(self, index: tuple) -> str:
        """What byte ``index`` (an index into ``pool``) is: a slot's record, or what surrounds them."""
        num_blocks, block_tokens, token_bytes = self.pages.shape
        if self.pool.dim() == 2:  # packed rows [rows, row_bytes]: the page starts at byte `lead` of a row
            row, byte = (int(i) for i in index)
            block = row - self.guard_blocks
            if not 0 <= block < num_blocks:
                return f"guard row {row} (outside the page view's blocks)"
            if self.lead <= byte < self.lead + block_tokens * token_bytes:
                return f"slot {block * block_tokens + (byte - self.lead) // token_bytes}"
            return f"another layer's page or row padding (byte {byte} of block {block}'s row)"
        block, offset, byte = (int(i) for i in index)
        block -= self.guard_blocks
        if not 0 <= block < num_blocks:
            return "a guard block"
        if not self.lead <= byte < self.lead + token_bytes:
            return "a guard byte"
        return f"slot {block * block_tokens + offset}"


def guarded_pages(spec, num_blocks: int, block_tokens: int, lead: int, trail: int, guard_blocks: int,
                  gen: torch.Generator) -> GuardedPages:
    width = lead + spec.token_bytes + trail
    pool = torch.randint(0, 256, (num_blocks + 2 * guard_blocks, block_tokens, width), generator=gen,
                         dtype=torch.uint8)
    pages = pool[guard_blocks: guard_blocks + num_blocks, :, lead: lead + spec.token_bytes]
    return GuardedPages(pool, pages, lead, guard_blocks)


def packed_cache(latent_fmt: str, index_fmt: str, num_blocks: int, block_tokens: int, gen: torch.Generator):
    """A real :class:`~dsahal.cache.PackedKVCache` of two DSA layers with ``num_blocks + 2`` rows of
    random bytes (its pages are 256-byte aligned in each row, rows rounded to 256 bytes). Returns
    ``(cache, pages(kind, layer=None) -> GuardedPages)``: rows ``1..num_blocks`` of a layer's page
    view (rows 0 and ``num_blocks + 1`` are guards); by default the page with other pages on both
    sides of it: layer 1's latent page, layer 0's index page."""
    from dsahal.cache import PackedKVCache, plan_layout
    from dsahal.config import ModelConfig

    config = ModelConfig(name="conformance-packed", layer_kinds=("dsa", "dsa"), vocab_size=1, hidden_size=1,
                         intermediate_size=1, num_heads=1, q_lora_rank=1)
    layout = plan_layout(config, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens,
                         row_rounding="page")
    cache = PackedKVCache(layout, num_blocks + 2)
    cache.pool.copy_(torch.randint(0, 256, cache.pool.shape, generator=gen, dtype=torch.uint8))

    def pages(kind: str, layer: int | None = None) -> GuardedPages:
        layer = (1 if kind == "latent" else 0) if layer is None else layer
        view = (cache.latent_pages if kind == "latent" else cache.index_pages)(layer)[1: 1 + num_blocks]
        return GuardedPages(cache.pool, view, layout.page(layer, kind).offset, 1)

    return cache, pages


def case_pages(layout: str, kind: str, fmt: str, num_blocks: int, block_tokens: int, lead: int, trail: int,
               guard_blocks: int, gen: torch.Generator) -> GuardedPages:
    """The pages of a one-kind case in ``layout`` (``lead``/``trail``/``guard_blocks``: records only)."""
    if layout == "packed":
        latent, index = (fmt, OTHER_FORMAT[kind]) if kind == "latent" else (OTHER_FORMAT[kind], fmt)
        return packed_cache(latent, index, num_blocks, block_tokens, gen)[1](kind)
    if layout != "records":
        raise ValueError(f"conformance: page layout expected one of {list(LAYOUTS)}, got {layout!r}")
    return guarded_pages(cache_format(kind, fmt), num_blocks, block_tokens, lead, trail, guard_blocks, gen)


def store(spec, pages: torch.Tensor, slots: torch.Tensor, values: torch.Tensor, scale) -> None:
    """Write packed records straight through the page view (the test's own cache write, so ops
    that read the cache are tested independently of the backend's ``cache_write``)."""
    if slots.numel() == 0:
        return
    block = torch.div(slots.long(), pages.shape[1], rounding_mode="floor")
    pages[block, slots.long() % pages.shape[1]] = spec.pack(values, scale)


@dataclass(frozen=True)
class CacheWriteCase(Case):
    kind: str
    fmt: str
    tokens: int
    num_blocks: int
    block_tokens: int
    skip_fraction: float
    dtype: str
    regime: str
    lead: int
    trail: int
    guard_blocks: int
    seed: int
    layout: str = "records"  # "packed": lead, trail and guard_blocks are the packed cache's
    index_dtype: str = "int32"  # of slots
    CALL = ("dsahal.ops.cache_write(args.values, args.slots, args.pages, kind=args.kind, "
                           "fmt=args.fmt, scale=args.scale)")

    def build(self) -> SimpleNamespace:
        spec = cache_format(self.kind, self.fmt)
        gen = generator(self.seed)
        guarded = case_pages(self.layout, self.kind, self.fmt, self.num_blocks, self.block_tokens, self.lead,
                             self.trail, self.guard_blocks, gen)
        values, scale = token_values(spec, self.tokens, self.regime, gen)
        num_slots = self.num_blocks * self.block_tokens
        slots = torch.randperm(num_slots, generator=gen)[: self.tokens]
        slots = torch.where(rand(gen, self.tokens) < self.skip_fraction, -1, slots).to(INDEX_DTYPES[self.index_dtype])
        return SimpleNamespace(values=values.to(DTYPES[self.dtype]), slots=slots, pages=guarded.pages,
                               kind=self.kind, fmt=self.fmt, scale=scale, guarded=guarded, spec=spec)


@dataclass(frozen=True)
class IndexerCase(Case):
    """``requests``: ``(context_length, query_tokens)`` per request; the queries are the last
    tokens of the context (decode with up to 8 speculative tokens, or a prefill chunk).
    ``width_delta``: output width minus the longest context (negative truncates).
    ``hole``: one mapped block of the first long-enough request is unmapped (-1)."""

    fmt: str
    requests: tuple
    heads: int
    q_dtype: str
    block_tokens: int
    spare_blocks: int
    hole: bool
    width_delta: int
    regime: str
    lead: int
    noncontiguous_q: bool
    seed: int
    layout: str = "records"
    index_dtype: str = "int32"  # of block_table, req_ids, positions
    fused_q: bool = False  # q: a slice of a fused projection output (rows not back to back)
    CALL = ("dsahal.ops.indexer_score(args.q, args.weights, args.index_pages, args.block_table, "
                           "args.req_ids, args.positions, index_fmt=args.index_fmt, max_context=args.max_context)")

    def build(self) -> SimpleNamespace:
        spec = cache_format("index", self.fmt)
        gen = generator(self.seed)
        meta = _paged_batch(self.requests, self.block_tokens, self.spare_blocks, self.hole, gen)
        guarded = case_pages(self.layout, "index", self.fmt, meta.num_blocks, self.block_tokens, self.lead, 0, 1, gen)
        keys, _ = token_values(spec, meta.mapped_slots.numel(), self.regime, gen)
        store(spec, guarded.pages, meta.mapped_slots, keys, None)
        tokens = meta.positions.numel()
        q = randn(gen, tokens, self.heads, INDEX_DIM)
        q = q.clamp(-FP8_LIMIT, FP8_LIMIT).to(DTYPES[self.q_dtype])
        if self.noncontiguous_q:
            q = strided_copy(q.float(), gen).to(q.dtype) if q.dtype != torch.float8_e4m3fn else q
        if self.fused_q:  # the index heads' columns of a wider projection output
            q = fused_slice(q.contiguous(), gen, 64, 192)
        weights = randn(gen, tokens, self.heads) / math.sqrt(self.heads)
        max_context = max(1, max(length for length, _ in self.requests) + self.width_delta)
        index = INDEX_DTYPES[self.index_dtype]
        return SimpleNamespace(q=q, weights=weights, index_pages=guarded.pages, block_table=meta.block_table.to(index),
                               req_ids=meta.req_ids.to(index), positions=meta.positions.to(index),
                               index_fmt=self.fmt, max_context=max_context, guarded=guarded)


@dataclass(frozen=True)
class SparseMlaCase(Case):
    """``slots`` ``[rows, topk]`` drawn from the pool's slots; ``minus_one_fraction`` of them -1,
    ``empty_rows`` all -1, ``duplicates`` lets a slot repeat in a row."""

    fmt: str
    rows: int
    heads: int
    topk: int
    num_blocks: int
    block_tokens: int
    minus_one_fraction: float
    empty_rows: tuple
    duplicates: bool
    q_dtype: str
    softmax_scale: float
    regime: str
    lead: int
    seed: int
    layout: str = "records"
    index_dtype: str = "int32"  # of slots
    fused_q: bool = False  # q: a slice of a fused projection output (rows not back to back)
    CALL = ("dsahal.ops.sparse_mla(args.q, args.kv_pages, args.slots, kv_fmt=args.kv_fmt, "
                           "kv_scale=args.kv_scale, softmax_scale=args.softmax_scale)")

    def build(self) -> SimpleNamespace:
        spec = cache_format("latent", self.fmt)
        gen = generator(self.seed)
        guarded = case_pages(self.layout, "latent", self.fmt, self.num_blocks, self.block_tokens, self.lead, 0, 1, gen)
        num_slots = self.num_blocks * self.block_tokens
        if self.duplicates:
            slots = torch.randint(0, num_slots, (self.rows, self.topk), generator=gen)
        else:
            slots = torch.stack([torch.randperm(num_slots, generator=gen)[: self.topk] for _ in range(self.rows)])
            if slots.shape[1] < self.topk:  # fewer slots than topk: pad with -1
                pad = torch.full((self.rows, self.topk - slots.shape[1]), -1)
                slots = torch.cat([slots, pad], dim=1)
        slots = torch.where(rand(gen, *slots.shape) < self.minus_one_fraction, -1, slots)
        for r in self.empty_rows:
            slots[r] = -1
        used = torch.unique(slots[slots >= 0])
        values, scale = token_values(spec, used.numel(), self.regime, gen)
        store(spec, guarded.pages, used, values, scale)
        q = randn(gen, self.rows, self.heads, LATENT_DIM)
        if self.regime in ("limit", "outlier"):  # keep logits finite-ish for 448-sized keys
            q = q / 64.0
        q = q.to(DTYPES[self.q_dtype])
        if self.fused_q:  # the absorbed q's columns of a fused projection output (q_nope | q_pe | more)
            q = fused_slice(q, gen, 128, 64)
        return SimpleNamespace(q=q, kv_pages=guarded.pages, slots=slots.to(INDEX_DTYPES[self.index_dtype]),
                               kv_fmt=self.fmt, kv_scale=scale, softmax_scale=self.softmax_scale, guarded=guarded)


@dataclass(frozen=True)
class DsaCase(Case):
    """One DSA layer over a paged batch: index keys and latents in their formats, top-``topk``."""

    latent_fmt: str
    index_fmt: str
    requests: tuple
    index_heads: int
    heads: int
    topk: int
    block_tokens: int
    q_dtype: str
    seed: int
    layout: str = "records"  # "packed": index and latent pages of one layer of one PackedKVCache
    CALL = ("dsahal.ops.dsa_attention(args.q_index, args.index_weights, args.index_pages, args.q, "
                           "args.kv_pages, args.block_table, args.req_ids, args.positions, index_fmt=args.index_fmt, "
                           "kv_fmt=args.kv_fmt, topk=args.topk, max_context=args.max_context, "
                           "softmax_scale=args.softmax_scale, kv_scale=args.kv_scale)")

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        index_spec, latent_spec = cache_format("index", self.index_fmt), cache_format("latent", self.latent_fmt)
        meta = _paged_batch(self.requests, self.block_tokens, 1, False, gen)
        if self.layout == "packed":
            _, pages = packed_cache(self.latent_fmt, self.index_fmt, meta.num_blocks, self.block_tokens, gen)
            index, latent = pages("index", 1), pages("latent", 1)  # one layer's two pages
        else:
            index = guarded_pages(index_spec, meta.num_blocks, self.block_tokens, 0, 0, 0, gen)
            latent = guarded_pages(latent_spec, meta.num_blocks, self.block_tokens, 0, 0, 0, gen)
        keys, _ = token_values(index_spec, meta.mapped_slots.numel(), "normal", gen)
        store(index_spec, index.pages, meta.mapped_slots, keys, None)
        latents, kv_scale = token_values(latent_spec, meta.mapped_slots.numel(), "normal", gen)
        store(latent_spec, latent.pages, meta.mapped_slots, latents, kv_scale)
        tokens = meta.positions.numel()
        dtype = DTYPES[self.q_dtype]
        return SimpleNamespace(
            q_index=randn(gen, tokens, self.index_heads, INDEX_DIM).to(dtype),
            index_weights=randn(gen, tokens, self.index_heads) / math.sqrt(self.index_heads),
            index_pages=index.pages, q=randn(gen, tokens, self.heads, LATENT_DIM).to(dtype),
            kv_pages=latent.pages, block_table=meta.block_table, req_ids=meta.req_ids, positions=meta.positions,
            index_fmt=self.index_fmt, kv_fmt=self.latent_fmt, topk=self.topk,
            max_context=max(length for length, _ in self.requests), softmax_scale=192 ** -0.5, kv_scale=kv_scale,
        )


def _paged_batch(requests, block_tokens: int, spare_blocks: int, hole: bool, gen: torch.Generator):
    """Block table, query metadata and mapped slots for ``requests`` = ``((length, queries), ...)``.
    Physical blocks are a random permutation; the table has one extra unmapped (-1) column."""
    needed = [max(1, math.ceil(length / block_tokens)) for length, _ in requests]
    num_blocks = sum(needed) + spare_blocks
    physical = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((len(requests), max(needed) + 1), -1, dtype=torch.int32)
    mapped, cursor = [], 0
    for r, count in enumerate(needed):
        for b in range(count):
            table[r, b] = physical[cursor]
            cursor += 1
    if hole:
        for r, count in enumerate(needed):
            if count >= 2:
                table[r, 0] = -1
                break
    for r, (length, _) in enumerate(requests):
        for pos in range(length):
            block = int(table[r, pos // block_tokens])
            if block >= 0:
                mapped.append(block * block_tokens + pos % block_tokens)
    req_ids, positions = [], []
    for r, (length, queries) in enumerate(requests):
        for pos in range(length - queries, length):
            req_ids.append(r)
            positions.append(pos)
    return SimpleNamespace(block_table=table, num_blocks=num_blocks,
                           mapped_slots=torch.tensor(mapped, dtype=torch.long),
                           req_ids=torch.tensor(req_ids, dtype=torch.int32),
                           positions=torch.tensor(positions, dtype=torch.int32))
