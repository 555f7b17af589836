"""Decode steps captured in CUDA graphs and replayed (``Engine(cuda_graph=True)``, ``dsahal run --cuda-graph``).

What serving engines (vLLM's and SGLang's CUDA graph runners) do, for the decode step
``model.step(..., decode=True)``:

- **static inputs**: one set of device buffers at the largest captured size (token ids, positions,
  request rows, write slots, ``cu_seqlens``, KDA state ids), sliced to each captured size, and one
  block table ``[max_batch + 1, max_blocks]`` shared by every graph; a step copies its inputs into
  them and replays. ``max_context`` is a Python int fixed per engine, so it is baked into the graph.
- **sizes**: a batch of ``B`` requests runs in the graph of the smallest captured size ``>= B``
  (1, 2, 4, then multiples of 8, and ``max_batch``), captured lazily the first time it is needed.
- **padding rows** (the ``size - B`` rows beyond the batch) are harmless by construction: write slot
  -1 (``cache_write`` skips it), KDA state id -1 (``kda_decode``: zero output, no state read or
  write; the short convolution reads a zero conv state and writes no request's: see
  :func:`dsahal.model.short_conv.write_states`), position 0 in the block table's extra last row, which maps no block (``-1`` everywhere: the
  indexer sees no key, top-k picks nothing, sparse MLA returns zeros). So they read nothing and
  write nothing; their logits rows are computed and ignored.
- **capture**: every static input is first set to padding, the step is run eagerly twice on a side
  stream (kernels compile and libraries initialise outside the capture; with every row a padding
  row the warm-up writes neither the cache nor a KDA state, recurrent or conv), then captured into a
  ``torch.cuda.CUDAGraph`` whose memory comes from one private pool shared by every graph of the
  engine (graphs never run concurrently and each graph's output is read before the next replay).
- **output**: the logits ``[size, vocab]`` live in the graph's pool; :meth:`DecodeGraphs.replay`
  returns a view of the first ``B`` rows, valid until the next replay.

The parts that do not need a GPU (padding, the buffers, the eager step over the buffers, which is
exactly what is captured) run on any device, so they are tested on the CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..registry.observers import CallLog, observe
from ..registry.state import active_table
from ..model import fused

PADDING_TOKEN = 0
WARMUP_STEPS = 2
FIELDS = ("token_ids", "positions", "req_ids", "slots", "cu_seqlens", "state_ids")
DTYPES = {"token_ids": torch.int64, "positions": torch.int32, "req_ids": torch.int32, "slots": torch.int64,
          "cu_seqlens": torch.int32, "state_ids": torch.int32}


def graph_batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes a decode graph may be captured for: 1, 2, 4, the multiples of 8, and ``max_batch``."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"graph_batch_sizes: max_batch expected an int >= 1, got {max_batch!r}")
    return sorted({s for s in (1, 2, 4, *range(8, max_batch + 1, 8)) if s <= max_batch} | {max_batch})


@dataclass
class DecodeInputs:
    """One decode step's loose inputs (what :meth:`HybridModel.step` takes besides the block table).

    ``batch`` rows are real requests; rows ``batch:size`` (if any) are padding rows.
    """

    token_ids: torch.Tensor  # [size] int64
    positions: torch.Tensor  # [size] int32
    req_ids: torch.Tensor  # [size] int32 block-table row
    slots: torch.Tensor  # [size] int64 write slot, -1: not written
    cu_seqlens: torch.Tensor  # [size + 1] int32
    state_ids: torch.Tensor  # [size] int32 KDA state, -1: none
    batch: int

    @property
    def size(self) -> int:
        return self.token_ids.shape[0]

    @classmethod
    def from_step(cls, step) -> "DecodeInputs":
        """The inputs of a decode :class:`~dsahal.engine.StepBatch` (one token per request, each sampled)."""
        meta = step.meta
        batch = meta.state_ids.shape[0]
        if not meta.decode or meta.num_tokens != batch:
            raise ValueError(f"DecodeInputs: expected a decode step of one token per request, got {meta.num_tokens} "
                             f"tokens for {batch} requests (decode={meta.decode})")
        if len(step.sampled) != batch:
            raise ValueError(f"DecodeInputs: a decode step samples every request, this one samples "
                             f"{len(step.sampled)} of {batch}")
        return cls(step.token_ids, meta.positions, meta.req_ids, meta.slots, meta.cu_seqlens, meta.state_ids, batch)


def pad_decode_inputs(inputs: DecodeInputs, size: int, padding_row: int) -> DecodeInputs:
    """``inputs`` with ``size - batch`` padding rows appended, in the buffers' dtypes, on the inputs' device.

    A padding row: token ``PADDING_TOKEN``, position 0, request row ``padding_row`` (a block-table
    row that maps no block), slot -1, state id -1, and a sequence of one token in ``cu_seqlens``.
    """
    batch = inputs.batch
    if size < batch:
        raise ValueError(f"pad_decode_inputs: size {size} is smaller than the batch ({batch} requests)")
    pad, device = size - batch, inputs.token_ids.device

    def extend(name: str, value: int) -> torch.Tensor:
        real = getattr(inputs, name)[:batch].to(DTYPES[name])
        return torch.cat([real, torch.full((pad,), value, dtype=DTYPES[name], device=device)])

    cu = inputs.cu_seqlens[:batch + 1].to(torch.int32)
    cu = torch.cat([cu, cu[-1:] + torch.arange(1, pad + 1, dtype=torch.int32, device=device)])
    return DecodeInputs(extend("token_ids", PADDING_TOKEN), extend("positions", 0), extend("req_ids", padding_row),
                        extend("slots", -1), cu, extend("state_ids", -1), batch)


class DecodeBuffers:
    """The static inputs of every captured decode step: one set at ``max_size`` rows, sliced per size,
    and the block table ``[max_batch + 1, max_blocks]`` int32 whose last row (``padding_row``) is
    always unmapped. Tensors are allocated once and never replaced (graphs hold their addresses)."""

    def __init__(self, max_size: int, max_batch: int, max_blocks: int, device: torch.device | str):
        self.max_size, self.max_batch, self.padding_row = max_size, max_batch, max_batch
        self.device = torch.device(device)
        self.tensors = {name: torch.zeros(max_size + (name == "cu_seqlens"), dtype=DTYPES[name], device=self.device)
                        for name in FIELDS}
        self.block_table = torch.full((max_batch + 1, max_blocks), -1, dtype=torch.int32, device=self.device)
        self._table_version: Optional[int] = None
        self.fill_padding(max_size)

    def view(self, size: int) -> DecodeInputs:
        """The first ``size`` rows of every buffer (views: what a graph of that size reads)."""
        if not 1 <= size <= self.max_size:
            raise ValueError(f"DecodeBuffers: size expected in [1, {self.max_size}], got {size}")
        t = self.tensors
        return DecodeInputs(*(t[name][:size + (name == "cu_seqlens")] for name in FIELDS), batch=size)

    def load(self, inputs: DecodeInputs) -> None:
        """Copy ``inputs`` (already padded to a size) into the first ``inputs.size`` rows."""
        target = self.view(inputs.size)
        for name in FIELDS:
            getattr(target, name).copy_(getattr(inputs, name))

    def load_block_table(self, block_table: torch.Tensor, version: Optional[int] = None) -> None:
        """Copy the engine's ``[max_batch, max_blocks]`` table into rows ``0..max_batch-1`` (skipped when
        ``version`` is given and equals the last loaded one); the padding row stays -1."""
        if version is not None and version == self._table_version:
            return
        if tuple(block_table.shape) != (self.max_batch, self.block_table.shape[1]):
            raise ValueError(f"DecodeBuffers: block_table expected shape [{self.max_batch}, "
                             f"{self.block_table.shape[1]}], got {list(block_table.shape)}")
        self.block_table[:self.max_batch].copy_(block_table)
        self._table_version = version

    def fill_padding(self, size: int) -> None:
        """Every row of the first ``size`` a padding row (what warm-up and capture run on)."""
        empty = DecodeInputs(*(torch.zeros(0 + (name == "cu_seqlens"), dtype=DTYPES[name], device=self.device)
                               for name in FIELDS), batch=0)
        self.load(pad_decode_inputs(empty, size, self.padding_row))


class DecodeGraphs:
    """Captured decode steps of one model over one cache, by batch size.

    Args:
        model: the :class:`~dsahal.model.HybridModel` (parameters on ``device``).
        views: the engine's :class:`~dsahal.model.ModelCache`.
        max_batch, max_blocks: the engine's block table shape; max_context: its static indexer width.
        device: where the model and cache live (capture needs CUDA; everything else runs anywhere).
        sizes: batch sizes graphs may be captured for (default :func:`graph_batch_sizes` of ``max_batch``).
    """

    def __init__(self, model, views, *, max_batch: int, max_blocks: int, max_context: int,
                 device: torch.device | str, sizes: Optional[Sequence[int]] = None):
        self.model, self.views, self.max_context = model, views, int(max_context)
        self.device = torch.device(device)
        self.sizes = sorted(set(sizes)) if sizes else graph_batch_sizes(max_batch)
        if self.sizes[0] < 1:  # (a size above max_batch only means more padding rows)
            raise ValueError(f"DecodeGraphs: sizes expected >= 1, got {self.sizes}")
        self.buffers = DecodeBuffers(self.sizes[-1], max_batch, max_blocks, self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None  # the private memory pool every graph of this object allocates from
        self.capture_seconds = 0.0

    def size_for(self, batch: int) -> int:
        """The smallest capturable size holding ``batch`` rows."""
        for size in self.sizes:
            if size >= batch:
                return size
        raise ValueError(f"DecodeGraphs: a batch of {batch} requests exceeds the largest graph size {self.sizes[-1]}")

    def load(self, inputs: DecodeInputs, block_table: torch.Tensor, version: Optional[int] = None) -> int:
        """Pad ``inputs`` to its graph size and copy them and the block table into the static buffers;
        returns the size."""
        size = self.size_for(inputs.batch)
        self.buffers.load(pad_decode_inputs(inputs, size, self.buffers.padding_row))
        self.buffers.load_block_table(block_table, version)
        return size

    @torch.no_grad()
    def forward(self, size: int) -> torch.Tensor:
        """The decode step over the static buffers' first ``size`` rows, run eagerly: what is captured.
        Returns logits ``[size, vocab]`` fp32."""
        b = self.buffers.view(size)
        with fused.enabled():  # captured once, replayed many times: the model's fused glue (dsahal.model.fused)
            return self.model.step(b.token_ids, b.positions, b.req_ids, self.buffers.block_table, b.slots,
                                   b.cu_seqlens, b.state_ids, self.views, max_context=self.max_context, decode=True)

    # --- CUDA only ----------------------------------------------------------------------------------
    def captured(self, size: int) -> bool:
        return size in self.graphs

    @torch.no_grad()
    def capture(self, size: int) -> float:
        """Warm up and capture the graph of ``size`` rows (once); returns the seconds it took (0 if captured).

        Leaves every static input set to padding: load the real inputs afterwards.
        """
        if size in self.graphs:
            return 0.0
        if self.device.type != "cuda":
            raise ValueError(f"DecodeGraphs.capture: CUDA graphs need a CUDA device, the model is on {self.device}")
        if size not in self.sizes:
            raise ValueError(f"DecodeGraphs.capture: size {size} is not one of {self.sizes}")
        torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        self.buffers.fill_padding(size)
        table = active_table()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with observe(CallLog()) as warmup, torch.cuda.stream(stream):
            for _ in range(WARMUP_STEPS):
                self.forward(size)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        fell_back = sorted(warmup.fallback_ops())
        if fell_back:
            raise RuntimeError(f"DecodeGraphs.capture: op(s) {fell_back} fell back to the reference on backend "
                               f"{table.name!r} in the warm-up step; the reference reads tensor values on the host "
                               f"and cannot be captured in a CUDA graph (run without cuda_graph / --cuda-graph)")
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                output = self.forward(size)
        except Exception as exc:  # name what was being captured; the cause stays chained
            raise RuntimeError(f"DecodeGraphs.capture: capturing the decode step of {size} rows on backend "
                               f"{table.name!r} failed (a host synchronisation or an uncapturable op in the step?): "
                               f"{type(exc).__name__}: {exc}") from exc
        torch.cuda.synchronize(self.device)
        self.graphs[size], self.outputs[size] = graph, output
        seconds = time.perf_counter() - start
        self.capture_seconds += seconds
        return seconds

    def replay(self, size: int) -> torch.Tensor:
        """Replay the graph of ``size`` rows on what the static buffers hold; returns its logits ``[size, vocab]``
        (the graph's static output: read it before the next replay)."""
        self.graphs[size].replay()
        return self.outputs[size]

    def run(self, inputs: DecodeInputs, block_table: torch.Tensor, version: Optional[int] = None) -> torch.Tensor:
        """Load ``inputs`` and replay (the graph of their size must be captured); logits ``[batch, vocab]``."""
        size = self.load(inputs, block_table, version)
        return self.replay(size)[:inputs.batch]
