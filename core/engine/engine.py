"""The engine loop: admit requests, chunked prefill, decode steps, sampling, freeing finished requests.

Scheduling is deliberately simple and deterministic: requests are admitted in arrival order while
a block-table row, a KDA state and the blocks for their whole length are free (no pre-emption);
a step is a prefill chunk (up to ``prefill_chunk_tokens`` prompt tokens from the admitted requests,
packed request after request) whenever any prompt is unfinished, otherwise a decode step of one
token for every running request.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..cache import CacheFullError
from ..model.batch import ModelCache
from ..model.dsa_attention import DsaAttention
from ..model.sampling import sample_one
from ..registry.state import active_table
from .batch import StepBatch, build_step, write_slots
from .cuda_graph import DecodeGraphs, DecodeInputs
from .request import Request
from .speculative import MAX_DRAFT_TOKENS, Drafter, speculative_step

VALIDATE_MODES = ("first", "always", "never")


@dataclass
class EngineStats:
    """Token counts and wall seconds (device-synchronised) of prefill and decode steps."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    prefill_steps: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    compile_seconds: float = 0.0  # the first compiled decode step (tracing + codegen), kept out of the rates
    graph_capture_seconds: float = 0.0  # CUDA graphs: warm-up + capture of each graph, kept out of the rates
    graph_sizes: list = field(default_factory=list)  # the batch sizes a decode graph was captured for
    graph_steps: int = 0  # decode steps replayed from a CUDA graph (the rest of decode_steps ran eagerly)
    draft_tokens: int = 0  # speculative decoding: drafts proposed
    accepted_draft_tokens: int = 0  # and accepted
    first_token_at: Optional[float] = None  # time.perf_counter() when the first token was emitted (any request)

    @staticmethod
    def _rate(tokens: int, seconds: float) -> float:
        return tokens / seconds if seconds > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self._rate(self.prefill_tokens, self.prefill_seconds)

    @property
    def decode_tokens_per_s(self) -> float:
        return self._rate(self.decode_tokens, self.decode_seconds)


class Engine:
    """Runs a :class:`~dsahal.model.HybridModel` over a packed cache for a stream of requests.

    Args:
        model: the model (its parameters on ``device``).
        cache: a :class:`dsahal.cache.PackedKVCache` (block and state allocator plus per-layer views).
        latent_fmt, index_fmt: the cache's formats (what the layers write and the ops read).
        max_batch: rows of the block table: requests running at once.
        max_context: the longest request (prompt + generated tokens) the block table maps.
        prefill_chunk_tokens: prompt tokens per prefill step (chunked prefill).
        attention: how DSA layers write and attend; default: the model's (single-device). Decode
            context parallelism passes its own object here.
        compile_decode: run decode steps through ``torch.compile(model.step, fullgraph=True)``.
        drafter: speculative decoding: ``drafter(request) -> draft token ids`` proposes up to
            ``max_draft_tokens`` (≤ 7) tokens to verify in each decode step
            (:mod:`dsahal.engine.speculative`; greedy acceptance, so requests must be greedy).
        cuda_graph: run decode steps by replaying CUDA graphs of ``model.step(..., decode=True)``, one per
            batch size bucket, captured the first time it is needed (:mod:`dsahal.engine.cuda_graph`).
            Prefill steps stay eager. Needs a CUDA device and a backend whose decode ops never fall back
            to the reference; not with ``compile_decode``, a drafter or decode context parallelism.
        graph_sizes: the batch sizes decode graphs may be captured for (default 1, 2, 4, multiples of 8
            and ``max_batch``); a batch runs padded up to the next one.
        validate: when the ops check their arguments (some checks read tensor values on the host, a
            device sync each): ``"first"`` (default): as the model and attention were built (checks on
            by default) until one prefill and one decode step have run, then off — every later step's
            tensors come from the same packing code; ``"always"``: left as built; ``"never"``: off.
            Requests themselves are always validated by :meth:`add`.
    """

    def __init__(self, model, cache, *, latent_fmt: str, index_fmt: str, max_batch: int, max_context: int,
                 prefill_chunk_tokens: int = 512, attention: Optional[DsaAttention] = None,
                 compile_decode: bool = False, drafter: Optional[Drafter] = None,
                 max_draft_tokens: int = MAX_DRAFT_TOKENS, cuda_graph: bool = False,
                 graph_sizes: Optional[list[int]] = None, validate: str = "first"):
        for name, value in (("max_batch", max_batch), ("max_context", max_context),
                            ("prefill_chunk_tokens", prefill_chunk_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Engine: {name} expected an int >= 1, got {value!r}")
        if isinstance(max_draft_tokens, bool) or not isinstance(max_draft_tokens, int) or \
                not 0 <= max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"Engine: max_draft_tokens expected an int in [0, {MAX_DRAFT_TOKENS}] (8 query tokens "
                             f"per request at most), got {max_draft_tokens!r}")
        if validate not in VALIDATE_MODES:
            raise ValueError(f"Engine: validate expected one of {VALIDATE_MODES}, got {validate!r}")
        self.drafter, self.max_draft_tokens = drafter, max_draft_tokens
        self.model, self.cache = model, cache
        self.config = model.config
        self.device = next(model.parameters()).device
        if attention is not None:
            model.set_attention(attention)
        self.block_tokens = int(cache.block_tokens)
        # Under decode context parallelism this process stores every W-th token: its block table maps
        # ceil(tokens / W) local tokens, and max_context stays a global width.
        self.context_shards = int(getattr(model.attention, "context_shards", 1))
        self.max_blocks = self._local_blocks(max_context)
        self.max_context = self.max_blocks * self.block_tokens * self.context_shards
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.views = ModelCache.from_packed(cache, self.config, latent_fmt, index_fmt)
        self.block_table = torch.full((max_batch, self.max_blocks), -1, dtype=torch.int32)
        self.free_rows = deque(range(max_batch))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.stats = EngineStats()
        self._ids: set[int] = set()
        self._decode_step = torch.compile(model.step, fullgraph=True) if compile_decode else model.step
        self._compiling = compile_decode
        self._table_version = 0  # bumped whenever the block table changes (graphs copy it only then)
        self.validate = validate
        self._validated: set[str] = set()  # step kinds ("prefill", "decode") that ran with checks on
        if validate == "never":
            self._set_op_checks(False)
        self.graphs: Optional[DecodeGraphs] = None
        if cuda_graph:
            self._check_cuda_graph(compile_decode)
            self.graphs = DecodeGraphs(model, self.views, max_batch=max_batch, max_blocks=self.max_blocks,
                                       max_context=self.max_context, device=self.device, sizes=graph_sizes)

    def _check_cuda_graph(self, compile_decode: bool) -> None:
        if self.device.type != "cuda":
            raise ValueError(f"Engine: cuda_graph=True needs a CUDA device, the model is on {self.device}")
        conflicts = [name for name, on in (("compile_decode", compile_decode), ("a drafter", self.drafter is not None),
                                           ("decode context parallelism", self.context_shards > 1)) if on]
        if conflicts:
            raise ValueError(f"Engine: cuda_graph=True cannot be combined with {' or '.join(conflicts)}")
        backend = active_table().name
        if backend == "reference":
            raise ValueError("Engine: cuda_graph=True on the reference backend: its ops read tensor values on the "
                             "host (it is the float64 oracle) and cannot be captured in a CUDA graph")

    # --- requests ---------------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request; raises ``ValueError`` if it cannot ever fit this engine."""
        if request.request_id in self._ids:
            raise ValueError(f"Engine.add: request_id {request.request_id} is already in use")
        if request.total_tokens > self.max_context:
            raise ValueError(f"Engine.add: request {request.request_id} needs {request.total_tokens} tokens "
                             f"(prompt {len(request.prompt)} + {request.max_new_tokens - 1} fed back), "
                             f"the engine maps at most max_context={self.max_context}")
        bad = [t for t in request.prompt if not 0 <= t < self.config.vocab_size]
        if bad:
            raise ValueError(f"Engine.add: request {request.request_id} has token ids outside "
                             f"[0, {self.config.vocab_size}): {bad[:5]}")
        self._ids.add(request.request_id)
        self.waiting.append(request)

    def _admit(self) -> None:
        while self.waiting and self.free_rows:
            request = self.waiting[0]
            needed = self._local_blocks(request.total_tokens)
            try:  # the state first: it needs an aligned run of rows, blocks take any single row
                state_id = int(self.cache.allocate_state())
            except CacheFullError as exc:  # nothing was allocated
                if self.running:
                    return  # wait for running requests to give rows back
                raise RuntimeError(f"Engine: no KDA state slot for request {request.request_id} and no running "
                                   f"request to free one: {exc}") from exc
            try:
                blocks = [int(b) for b in self.cache.allocate_blocks(needed)]
            except CacheFullError as exc:
                self.cache.free_state(state_id)
                if self.running:
                    return
                raise RuntimeError(f"Engine: request {request.request_id} needs {needed} cache blocks and no "
                                   f"running request can free any: {exc}") from exc
            self.waiting.popleft()
            request.row, request.blocks, request.state_id = self.free_rows.popleft(), blocks, state_id
            self.block_table[request.row, :needed] = torch.tensor(blocks, dtype=torch.int32)
            self._table_version += 1
            self.running.append(request)

    def _local_blocks(self, tokens: int) -> int:
        return math.ceil(math.ceil(tokens / self.context_shards) / self.block_tokens)

    def _release(self, request: Request) -> None:
        """Give a finished request's blocks, KDA state and block-table row back."""
        self.cache.free_blocks(request.blocks)
        self.cache.free_state(request.state_id)
        self.block_table[request.row] = -1
        self._table_version += 1
        self.free_rows.append(request.row)
        request.row, request.blocks, request.state_id = None, [], None
        self.running.remove(request)
        self.finished.append(request)

    # --- steps ------------------------------------------------------------------------------------
    def _schedule(self) -> tuple[list[tuple[Request, int]], bool]:
        prefilling = [r for r in self.running if r.in_prefill]
        if not prefilling:
            return [(r, 1) for r in self.running], True
        scheduled, budget = [], self.prefill_chunk_tokens
        for request in prefilling:
            count = min(len(request.prompt) - request.num_computed, budget)
            if count == 0:
                break
            scheduled.append((request, count))
            budget -= count
        return scheduled, False

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        meta = batch.meta
        if meta.decode:
            return self._decode_step(batch.token_ids, meta.positions, meta.req_ids, meta.block_table, meta.slots,
                                     meta.cu_seqlens, meta.state_ids, self.views, max_context=meta.max_context,
                                     decode=True)
        return self.model(batch.token_ids, meta, self.views, batch.logits_indices)

    @torch.no_grad()
    def step(self) -> Optional[StepBatch]:
        """Run one step; returns what ran (None when there is nothing to do)."""
        self._admit()
        if not self.running:
            return None
        scheduled, decode = self._schedule()
        if decode and self.drafter is not None:
            batch = speculative_step(self)
            self._step_validated("decode")
            return batch
        graphs = self.graphs if decode else None
        batch = build_step(scheduled, self.block_table, self.block_tokens, self.max_context, decode,
                           torch.device("cpu") if graphs else self.device,  # graphs copy into their own buffers
                           slot_fn=getattr(self.model.attention, "write_slots", write_slots))
        if graphs is not None:
            inputs = DecodeInputs.from_step(batch)
            size = graphs.size_for(inputs.batch)
            if not graphs.captured(size):
                self.stats.graph_capture_seconds += graphs.capture(size)
                self.stats.graph_sizes.append(size)
            # Untimed, like the eager step's host-to-device copies in build_step: the inputs into the buffers.
            graphs.load(inputs, self.block_table, self._table_version)
        start = time.perf_counter()
        if graphs is not None:
            logits = graphs.replay(size)[:inputs.batch]
        else:
            logits = self._forward(batch)
        if logits.is_cuda:
            torch.cuda.synchronize(logits.device)
        elapsed = time.perf_counter() - start
        tokens = batch.meta.num_tokens
        if graphs is not None:
            self.stats.graph_steps += 1
        if decode and self._compiling:
            self._compiling = False
            self.stats.compile_seconds += elapsed
        elif decode:
            self.stats.decode_tokens += tokens
            self.stats.decode_seconds += elapsed
            self.stats.decode_steps += 1
        else:
            self.stats.prefill_tokens += tokens
            self.stats.prefill_seconds += elapsed
            self.stats.prefill_steps += 1
        for request, count in scheduled:
            request.num_computed += count
        self._emit(batch, logits)
        self._step_validated("decode" if decode else "prefill")
        return batch

    def _set_op_checks(self, on: bool) -> None:
        """Turn the ops' argument checks on or off for every layer (KDA layers and the DSA attention)."""
        self.model.check_ops = on
        if hasattr(self.model.attention, "check"):
            self.model.attention.check = on

    def _step_validated(self, kind: str) -> None:
        if self.validate != "first" or kind in self._validated:
            return
        self._validated.add(kind)
        if self._validated == {"prefill", "decode"}:
            self._set_op_checks(False)

    def _emit(self, batch: StepBatch, logits: torch.Tensor) -> None:
        rows = logits.float().cpu()
        offset = len(batch.sampled)  # prompt rows (recorded, never sampled) follow the sampled ones
        for request, count in batch.prompt_rows:
            request.prompt_logits.append(rows[offset:offset + count].clone())
            offset += count
        for index, request in enumerate(batch.sampled):
            if request.record_logits:
                request.logits.append(rows[index].clone())
            if request.forced_tokens is not None:
                token = int(request.forced_tokens[len(request.output)])
            else:
                token = sample_one(rows[index], request.sampling, request.generator)
            request.output.append(token)
            if self.stats.first_token_at is None:  # after logits.cpu() above: the token exists on the host
                self.stats.first_token_at = time.perf_counter()
            if request.finished:
                self._release(request)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def run(self, requests: list[Request] = (), progress: Optional[Callable[["Engine", StepBatch], None]] = None
            ) -> list[Request]:
        """Add ``requests`` and step until every request finished; returns them in ``request_id`` order.

        ``progress(engine, batch)`` is called after every step.
        """
        for request in requests:
            self.add(request)
        while not self.idle:
            batch = self.step()
            if batch is None:
                raise RuntimeError("Engine.run: requests are waiting but none can be admitted")
            if progress is not None:
                progress(self, batch)
        return sorted(self.finished, key=lambda r: r.request_id)
