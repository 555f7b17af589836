"""Cases: plain parameters that rebuild an op's arguments deterministically.

Hypothesis draws a case (small, shrinkable, printable); ``case.build()`` turns it into tensors
with a seeded generator. The ``repr`` of a case is valid Python, so a failure's reproduction
snippet is ``<case>.build()`` followed by the op call. This module holds the cases of the ops
that take no paged cache; :mod:`dsahal.conformance.paged` holds the paged ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Optional

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float8_e4m3fn": torch.float8_e4m3fn, "float64": torch.float64}
# Index tensors (slots, lengths, ids, block tables): every op accepts both; a kernel that reads an
# int64 buffer as int32 words passes every int32 case.
INDEX_DTYPES = {"int32": torch.int32, "int64": torch.int64}
NEG_INF = float("-inf")
# The packed cache's KDA state rows (:meth:`dsahal.cache.PackedKVCache.kda_states`): a state slot is
# ``rows_per_state`` rows of this many bytes, each layer's state starting on a 256-byte boundary and
# followed by its short-convolution state (3 x (kernel - 1) x H*K fp32, also 256-byte aligned).
STATE_ROW_BYTES = 4096
STATE_ALIGN_FLOATS = 256 // 4
CONV_STATE_INPUTS = 3 * (4 - 1)  # q, k, v x (kernel - 1) inputs per channel (dsahal.cache.KDA_CONV_KERNEL)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, dtype=torch.float32)


def strided_copy(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The same values as a non-contiguous view (every other column of a wider buffer)."""
    wide = torch.empty((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
    wide[..., 1::2] = randn(gen, *t.shape).to(t.dtype) if t.is_floating_point() else 0
    wide[..., ::2] = t
    return wide[..., ::2]


def fused_slice(t: torch.Tensor, gen: torch.Generator, before: int, after: int) -> torch.Tensor:
    """The same values as a slice of a fused projection's output: ``t`` ``[T, *rest]`` becomes
    columns ``[before, before + prod(rest))`` of a ``[T, before + prod(rest) + after]`` buffer (the
    other columns random), unflattened: strides ``(width, ..., 1)``, a storage offset of ``before``,
    rows not back to back. How a model hands q (and KDA's q, k, v) to the ops."""
    rows, inner = t.shape[0], math.prod(t.shape[1:])
    fused = randn(gen, rows, before + inner + after).to(t.dtype)
    view = fused[:, before: before + inner].unflatten(1, tuple(t.shape[1:]))
    view.copy_(t)
    return view


def untouched_mask(base: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """Bool mask over ``base`` (``view``'s base buffer): True on every element ``view`` does not
    cover (other layers' data, row padding, guard rows), which an op given ``view`` must not change."""
    marks = torch.zeros(base.numel(), dtype=torch.uint8, device=base.device)
    offset = view.storage_offset() - base.storage_offset()
    marks.as_strided(view.shape, view.stride(), offset).fill_(1)
    return (marks == 0).reshape(base.shape)


def packed_state_pool(states: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``states`` ``[P, H, K, V]`` fp32 placed as the KDA state view of the packed cache.

    The geometry of :meth:`dsahal.cache.PackedKVCache.kda_states`: state slot ``i`` is
    ``rows_per_state`` rows of :data:`STATE_ROW_BYTES`; in it, three KDA layers' ``[H, K, V]``
    states each start on a 256-byte boundary, each followed by its layer's conv state, and the middle
    one is the view. So
    ``stride(0) = rows_per_state * row_floats`` (not ``H*K*V``), the view starts at a storage offset,
    and every state has another layer's floats on both sides; one more slot of random floats
    follows the last. Returns ``(view, base)``; ``base`` is the contiguous fp32 row buffer.
    """
    pool, heads, key_dim, value_dim = states.shape
    layer = heads * key_dim * value_dim
    def align(floats: int) -> int:
        return -(-floats // STATE_ALIGN_FLOATS) * STATE_ALIGN_FLOATS

    step = align(layer) + align(CONV_STATE_INPUTS * heads * key_dim)  # one layer: recurrent, then conv state
    row_floats = STATE_ROW_BYTES // 4
    rows_per_state = -(-(2 * step + align(layer) + CONV_STATE_INPUTS * heads * key_dim) // row_floats)
    base = randn(gen, (pool + 1) * rows_per_state, row_floats)
    view = base.as_strided(states.shape, (rows_per_state * row_floats, key_dim * value_dim, value_dim, 1), step)
    view.copy_(states)
    return view, base


@dataclass(frozen=True)
class Case:
    """Base of every case: ``build()`` -> a namespace of op arguments; ``CALL`` is the op call
    (Python source over ``args``) that the reproduction snippet prints."""

    CALL = ""

    def build(self) -> SimpleNamespace:
        raise NotImplementedError

    def describe_shapes(self) -> str:
        args = self.build()
        parts = []
        for name, value in vars(args).items():
            if isinstance(value, torch.Tensor):
                dtype = str(value.dtype).replace("torch.", "")
                contiguous = "" if value.is_contiguous() else " non-contiguous"
                parts.append(f"{name} {list(value.shape)} {dtype}{contiguous}")
        return ", ".join(parts)

    def snippet(self, backend: str) -> str:
        module = type(self).__module__
        return "\n".join([
            "import torch, dsahal",
            f"from {module} import {type(self).__name__}",
            f"case = {self!r}",
            "args = case.build()",
            f"dsahal.set_backend({backend!r})  # a plugin backend must be installed or in DSAHAL_PLUGIN_MODULES",
            f"got = {self.CALL}",
            "args = case.build()",
            "with dsahal.use_backend('reference'):",
            f"    expected = {self.CALL}",
            "print(got, expected, sep='\\n')",
        ])

    def replace(self, **changes):
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return type(self)(**values)


def score_rows(gen: torch.Generator, rows: int, width: int, k: int, lengths, mode: str,
               neg_inf_fraction: float, inf_rows) -> torch.Tensor:
    """Scores ``[rows, width]`` fp32 for top-k style ops.

    ``mode``: ``"continuous"`` (distinct values), ``"palette"`` (four values: heavy ties
    everywhere), ``"straddle"`` (a group of equal scores spanning the k-th place of every row
    long enough), ``"equal"`` (every valid score the same: the tie rule alone decides). Entries past a row's length are garbage, half of it huge, so a backend that
    ignores ``lengths`` is caught. ``inf_rows`` are entirely -inf.
    """
    if mode == "palette":
        scores = torch.randint(0, 4, (rows, width), generator=gen).float()
    elif mode == "equal":
        scores = torch.full((rows, width), 0.5)
    else:
        scores = randn(gen, rows, width)
    if mode == "straddle":
        for r, length in enumerate(lengths):
            if length > k:
                order = torch.argsort(scores[r, :length], descending=True, stable=True)
                lo, hi = max(0, k - 3), min(length, k + 2)
                scores[r, order[lo:hi]] = float(scores[r, order[k - 1]])
    if neg_inf_fraction > 0:
        scores = torch.where(rand(gen, rows, width) < neg_inf_fraction, NEG_INF, scores)
    columns = torch.arange(width)
    past = columns[None, :] >= torch.tensor(list(lengths), dtype=torch.long)[:, None]
    garbage = torch.where(rand(gen, rows, width) < 0.5, 1e30, randn(gen, rows, width))
    scores = torch.where(past, garbage, scores)
    for r in inf_rows:
        scores[r] = NEG_INF
    return scores


@dataclass(frozen=True)
class TopkCase(Case):
    rows: int
    width: int
    k: int
    lengths: tuple
    mode: str
    neg_inf_fraction: float
    inf_rows: tuple
    noncontiguous: bool
    seed: int
    index_dtype: str = "int32"  # of lengths
    CALL = "dsahal.ops.topk(args.scores, args.lengths, args.k)"

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        scores = score_rows(gen, self.rows, self.width, self.k, self.lengths, self.mode,
                            self.neg_inf_fraction, self.inf_rows)
        if self.noncontiguous:
            scores = strided_copy(scores, gen)
        return SimpleNamespace(scores=scores, lengths=torch.tensor(self.lengths, dtype=INDEX_DTYPES[self.index_dtype]),
                               k=self.k)


@dataclass(frozen=True)
class MergeCase(Case):
    """A context of ``lengths[t]`` tokens per row, interleaved over ``world`` ranks.
    ``concentrated``: every winner lives on rank ``hot_rank`` (the adversarial case for a merge
    that sends only a few candidates per rank)."""

    world: int
    rows: int
    k: int
    lengths: tuple
    mode: str
    neg_inf_fraction: float
    concentrated: bool
    hot_rank: int
    seed: int
    CALL = "[(args.local_scores[r], args.local_lengths[r]) for r in range(case.world)]  # per rank"

    @property
    def global_width(self) -> int:
        return max(1, max(self.lengths))

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        width, world = self.global_width, self.world
        scores = score_rows(gen, self.rows, width, self.k, self.lengths, self.mode, self.neg_inf_fraction, ())
        if self.concentrated:
            hot = (torch.arange(width) % world == self.hot_rank)[None, :]
            scores = torch.where(hot & torch.isfinite(scores), scores + 1000.0, scores)
        local_width = math.ceil(width / world)
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        local_scores, local_lengths = [], []
        for rank in range(world):
            local = randn(gen, self.rows, local_width) * 1e3  # garbage past the local length
            mine = scores[:, rank::world]
            local[:, : mine.shape[1]] = mine
            count = torch.clamp(torch.div(lengths - rank + world - 1, world, rounding_mode="floor"), min=0)
            local_scores.append(local)
            local_lengths.append(count.to(torch.int32))
        return SimpleNamespace(scores=scores, lengths=lengths.to(torch.int32), k=self.k,
                               local_scores=local_scores, local_lengths=local_lengths)

    def snippet(self, backend: str) -> str:
        return "\n".join([
            "# run on every rank r of a torch.distributed group of size case.world (e.g. torchrun, gloo):",
            "import torch, torch.distributed as dist, dsahal",
            f"from {type(self).__module__} import {type(self).__name__}",
            f"case = {self!r}",
            "args, r = case.build(), dist.get_rank()",
            f"dsahal.set_backend({backend!r})",
            "got = dsahal.ops.topk_merge(args.local_scores[r], args.local_lengths[r], args.k)",
            "with dsahal.use_backend('reference'):",
            "    expected = dsahal.ops.topk(args.scores, args.lengths, args.k)",
        ])


@dataclass(frozen=True)
class SlotsCase(Case):
    rows: int
    cols: int
    requests: int
    max_blocks: int
    block_tokens: int
    num_blocks: int
    padding_fraction: float
    unmapped_fraction: float
    seed: int
    index_dtype: str = "int32"  # of positions, req_ids and block_table
    CALL = "dsahal.ops.positions_to_slots(args.positions, args.req_ids, args.block_table, args.block_tokens)"

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        table = torch.randint(0, self.num_blocks, (self.requests, self.max_blocks), generator=gen)
        table = torch.where(rand(gen, *table.shape) < self.unmapped_fraction, -1, table).to(torch.int32)
        capacity = self.max_blocks * self.block_tokens
        positions = torch.randint(0, capacity, (self.rows, self.cols), generator=gen)
        positions = torch.where(rand(gen, self.rows, self.cols) < self.padding_fraction, -1, positions)
        req_ids = torch.randint(0, self.requests, (self.rows,), generator=gen)
        index = INDEX_DTYPES[self.index_dtype]
        return SimpleNamespace(positions=positions.to(index), req_ids=req_ids.to(index), block_table=table.to(index),
                               block_tokens=self.block_tokens)


@dataclass(frozen=True)
class LseCase(Case):
    """``lse_offset`` shifts every partial lse (large values test an overflow-safe combine);
    ``spread`` makes one part dominate; ``neg_inf_fraction`` empties parts. ``padded``: ``o_parts``
    is a view of a split-K workspace whose rows are wider than ``dim`` (strided, not contiguous)."""

    parts: int
    rows: int
    heads: int
    dim: int
    dtype: str
    lse_offset: float
    spread: float
    neg_inf_fraction: float
    all_inf_rows: tuple
    seed: int
    padded: bool = False
    CALL = "dsahal.ops.lse_combine(args.o_parts, args.lse_parts)"

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        o_parts = randn(gen, self.parts, self.rows, self.heads, self.dim).to(DTYPES[self.dtype])
        if self.padded:
            workspace = randn(gen, self.parts, self.rows, self.heads, self.dim + 8).to(o_parts.dtype)
            workspace[..., : self.dim] = o_parts
            o_parts = workspace[..., : self.dim]
        lse = self.lse_offset + self.spread * randn(gen, self.parts, self.rows, self.heads)
        lse = torch.where(rand(gen, *lse.shape) < self.neg_inf_fraction, NEG_INF, lse)
        for r in self.all_inf_rows:
            lse[:, r] = NEG_INF
        return SimpleNamespace(o_parts=o_parts, lse_parts=lse)


@dataclass(frozen=True)
class KdaCase(Case):
    """Variable-length sequences packed along T, with pooled states.

    ``padded``: per request, whether it uses state id -1 (no state). ``decay``: ``"none"``
    (g = 0), ``"mild"`` or ``"strong"`` (g down to -5 per step). Spare pool rows are guards: a
    backend must leave them untouched. ``pool_layout``: ``"dense"`` (a contiguous ``[P, H, K, V]``
    pool) or ``"packed"`` (the packed cache's strided state view, :func:`packed_state_pool`;
    ``state_base`` is then the buffer around it, whose other floats must not change). ``fused``:
    q, k, v are slices of one fused projection output and g a slice of a wider gate output.
    ``gate_dtype``: g's dtype (the op takes any float dtype and computes with it in fp32)."""

    seqlens: tuple
    heads: int
    key_dim: int
    value_dim: int
    dtype: str
    use_qk_l2norm: bool
    scale: Optional[float]
    decay: str
    padded: tuple
    spare_states: int
    seed: int
    index_dtype: str = "int32"  # of state_ids and cu_seqlens
    pool_layout: str = "dense"
    fused: bool = False
    gate_dtype: str = "float32"  # g's dtype: the op takes any float dtype and uses it in fp32 (models pass fp32)
    CALL = ("dsahal.ops.kda_prefill(args.q, args.k, args.v, args.g, args.beta, args.cu_seqlens, "
                           "args.state_pool, args.state_ids, scale=args.scale, use_qk_l2norm=args.use_qk_l2norm)")

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        dtype = DTYPES[self.dtype]
        tokens, h, kd, vd = sum(self.seqlens), self.heads, self.key_dim, self.value_dim
        q = randn(gen, tokens, h, kd)
        k = randn(gen, tokens, h, kd)
        if not self.use_qk_l2norm:  # keep β·|k|² < 2 so the recurrence stays bounded
            q, k = q / math.sqrt(kd), k / math.sqrt(kd)
        v = randn(gen, tokens, h, vd)
        strength = {"none": 0.0, "mild": 0.1, "strong": 5.0}[self.decay]
        g = (-strength * rand(gen, tokens, h, kd)).to(DTYPES[self.gate_dtype])
        beta = torch.sigmoid(randn(gen, tokens, h))
        pool_size = len(self.seqlens) + self.spare_states
        state_pool = 0.3 * randn(gen, pool_size, h, kd, vd)
        order = torch.randperm(pool_size, generator=gen)[: len(self.seqlens)]
        index = INDEX_DTYPES[self.index_dtype]
        state_ids = torch.where(torch.tensor(self.padded, dtype=torch.bool), -1, order).to(index)
        cu = torch.tensor([0, *torch.cumsum(torch.tensor(self.seqlens), 0).tolist()], dtype=index)
        state_base = state_pool
        if self.pool_layout == "packed":
            state_pool, state_base = packed_state_pool(state_pool, gen)
        q, k, v, beta = q.to(dtype), k.to(dtype), v.to(dtype), beta.to(dtype)
        if self.fused:  # q | k | v columns of one [T, H*K + H*K + H*V] projection output
            fused = torch.empty((tokens, h * (2 * kd + vd)), dtype=dtype)
            views = []
            for x, start in ((q, 0), (k, h * kd), (v, 2 * h * kd)):
                view = fused[:, start: start + h * x.shape[-1]].unflatten(1, (h, x.shape[-1]))
                view.copy_(x)
                views.append(view)
            q, k, v = views
            g = fused_slice(g, gen, 3, 5)  # the gate from a wider low-rank projection output
        return SimpleNamespace(q=q, k=k, v=v, g=g, beta=beta,
                               cu_seqlens=cu, state_pool=state_pool, state_ids=state_ids, scale=self.scale,
                               use_qk_l2norm=self.use_qk_l2norm, state_base=state_base)


@dataclass(frozen=True)
class CollectiveCase(Case):
    """Per-rank tensors for all_gather / all_to_all. ``splits``: rows rank s sends to rank d
    (``splits[s][d]``), or None for equal splits of ``rows`` per destination."""

    world: int
    rows: int
    tail: tuple
    dtype: str
    splits: Optional[tuple]
    seed: int
    CALL = "[args.inputs[r] for r in range(case.world)]  # per rank"

    def build(self) -> SimpleNamespace:
        gen = generator(self.seed)
        dtype = DTYPES[self.dtype]
        inputs = []
        for s in range(self.world):
            count = sum(self.splits[s]) if self.splits is not None else self.rows * self.world
            inputs.append((100 * randn(gen, count, *self.tail)).to(dtype))
        return SimpleNamespace(inputs=inputs)

    def snippet(self, backend: str) -> str:
        return "\n".join([
            "# run on every rank r of a torch.distributed group of size case.world (gloo):",
            "import torch.distributed as dist, dsahal",
            f"from {type(self).__module__} import {type(self).__name__}",
            f"case = {self!r}",
            f"args, r = case.build(), dist.get_rank(); dsahal.set_backend({backend!r})",
            "gathered = dsahal.ops.all_gather(args.inputs[r])",
        ])
