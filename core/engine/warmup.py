"""Compile warm-up: run the serving path's kernels once on dummy inputs, concurrently, before the first prefill.

On a fresh GPU machine almost all of the first prefill step's time is Triton compiling the attention
kernels on first use (H200, k31-pro-slice, empty cache: fla's chunk_kda kernels 7.4 s, the DSA indexer and
top-k 4.4 s, sparse MLA 2.4 s), one kernel after the other in the order the model launches them. The
warm-up runs the same launches up front as independent *jobs* on threads, so the compilations overlap:

- ``KDA prefill``: the first KDA layer's norm and attention on a dummy batch of the first real prefill step's
  shape (same token count, sequences, dtype, cache views), ``KDA decode`` a decode-shaped step (one token per
  request) on the last KDA layer (the same one when there is only one: the values are dummy);
- ``DSA prefill`` / ``DSA decode``: the same for the DSA (MLA + indexer) layers;
- with the model's fused glue on for eager steps (:func:`dsahal.model.fused.enable_by_default`; off by
  default, the CUDA-graph path compiles it at its capture), the KDA jobs run whole blocks and ``DSA glue
  prefill`` / ``decode`` the DSA layers' whole blocks around a stand-in attention, the glue's kernels on
  threads of their own;
- ``sparse MLA prefill`` / ``decode``: :func:`dsahal.ops.sparse_mla` alone with the arguments the DSA layer
  hands it, so its kernels compile beside the indexer's instead of after them.

Why threads (measured 2026-12-01, ``aot`` compiles for sm_90 of four dsahal kernels on a shared 2-core CPU,
Triton 3.9, a fresh cache each run; the quietest run of each): sequential 6.2 s, a thread per kernel 4.0 s
(2 cores' floor 3.1 s), a spawned process per kernel 10.6 s (each imports torch, Triton and dsahal before
compiling). Triton releases the GIL in its MLIR/LLVM passes and runs ``ptxas`` as a subprocess: a
pure-Python thread beside a compile kept 58-91 % of its solo speed in every stage (it would stop dead in a
stage that held the GIL); only the AST-to-TTIR code generation (~4 % of a compile) is Python. Each thread runs its job on its own CUDA stream, in a copy of the caller's context (so a
``use_backend`` block applies: it is a context variable), with autograd off.

Nothing the real run sees changes: the jobs map their own block table onto the first rows of the cache
(state slots ``0..B-1`` and the blocks after them, never through the allocator); what they write there
(those slots' KDA states and those blocks' pages in the layers they run, and the latent scales) is copied
before and written back after, and the dummy inputs come from a private generator (the
global RNG is untouched). Compiled kernels are the only thing that stays. A job that fails is reported
(``WarmupResult.errors``) and the run goes on: its kernels then compile on first use as before.
"""
from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .. import ops
from ..model.batch import BatchMeta, DsaLayerCache
from ..model import fused
from ..model.dsa_attention import LocalDsaAttention
from ..registry.state import active_table
from .batch import write_slots
from .progress import PhaseProgress, say

POLL_S = 0.5  # how often the compile bar redraws while jobs run (its clock moves even between jobs)


@dataclass
class WarmupResult:
    """What the warm-up did: ``seconds`` of wall time, the ``jobs`` it ran (names) and each one's own seconds
    (``job_seconds``, from its start on its thread to its stream's end: with the compilations overlapping,
    ``seconds`` stays near the longest job rather than their sum), ``errors`` (``"job: error"``) and
    ``skipped``: why nothing ran ("" when it ran)."""

    seconds: float = 0.0
    jobs: list[str] = field(default_factory=list)
    job_seconds: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: str = ""
    threads: int = 0

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "jobs": list(self.jobs), "job_seconds": dict(self.job_seconds),
                "errors": list(self.errors), "skipped": self.skipped, "threads": self.threads}


def skip_reason(backend: str, device: torch.device, attention) -> str:
    """Why a warm-up would do nothing useful here ("" when it applies): the reference backend and the CPU
    compile nothing (eager torch; Triton on a CPU is the interpreter), and a multi-process attention (decode
    context parallelism, --tp) exchanges tensors with the other ranks, which one rank's threads cannot do."""
    if backend == "reference":
        return "nothing to compile: the reference backend runs eager torch"
    if device.type == "cpu":
        return "nothing to compile on the CPU"
    if not isinstance(attention, LocalDsaAttention):
        return (f"not with a multi-process attention ({type(attention).__name__} exchanges tensors between the "
                f"ranks); kernels compile on first use")
    return ""


def first_prefill_step(prompt_lengths: list[int], max_batch: int, chunk: int) -> list[int]:
    """Tokens per sequence of the engine's first prefill step: requests in arrival order (up to ``max_batch``
    rows), each taking ``min(prompt, budget left)`` of the ``chunk`` budget, as ``Engine._schedule`` packs."""
    counts, budget = [], chunk
    for length in prompt_lengths[:max_batch]:
        count = min(length, budget)
        if count == 0:
            break
        counts.append(count)
        budget -= count
    return counts


@dataclass
class _Dummy:
    """The dummy batches of one warm-up and the cache rows they touch."""

    prefill: BatchMeta
    decode: BatchMeta
    states: int  # the jobs use KDA state slots [0, states)
    blocks: tuple[int, int]  # and blocks (rows) [start, end), after the state slots' rows


def _dummy_batches(engine, prompt_lengths: list[int]) -> _Dummy:
    """The first prefill step's shape and a decode step of one token for each of ``len(prompt_lengths)``
    requests (capped at the block table's rows), mapped onto the first rows of ``engine.cache``."""
    cache, block_tokens = engine.cache, engine.block_tokens
    max_batch, max_blocks = engine.block_table.shape
    counts = first_prefill_step(prompt_lengths, max_batch, engine.prefill_chunk_tokens)
    decoders = min(len(prompt_lengths), max_batch)
    rows_per_state = cache.layout.rows_per_state
    state_rows = decoders * rows_per_state if rows_per_state else 0
    if rows_per_state and decoders > cache.num_state_slots:
        raise ValueError(f"warm-up: {decoders} requests need {decoders} KDA state slots, the cache has "
                         f"{cache.num_state_slots}")
    # request r's dummy tokens: its first-step tokens (prefill), then one more at the next position (decode)
    lengths = [(counts[r] if r < len(counts) else 0) + 1 for r in range(decoders)]
    need = [math.ceil(n / block_tokens) for n in lengths]
    if any(n > max_blocks for n in need) or state_rows + sum(need) > cache.num_rows:
        raise ValueError(f"warm-up: the dummy batch needs {state_rows + sum(need)} cache rows and up to "
                         f"{max(need)} blocks per request, the cache has {cache.num_rows} rows and the block table "
                         f"{max_blocks} blocks per request")
    table = torch.full((max_batch, max_blocks), -1, dtype=torch.int32)
    next_row = state_rows  # blocks after the state slots, so the two never overlap
    for r, n in enumerate(need):
        table[r, :n] = torch.arange(next_row, next_row + n, dtype=torch.int32)
        next_row += n
    slot_fn = getattr(engine.model.attention, "write_slots", write_slots)

    def meta(positions: list[int], rows: list[int], seqs: list[int], decode: bool) -> BatchMeta:
        positions_t, rows_t = torch.tensor(positions, dtype=torch.int32), torch.tensor(rows, dtype=torch.int32)
        cu = torch.tensor([0, *itertools.accumulate(seqs)], dtype=torch.int32)
        state_ids = torch.arange(len(seqs), dtype=torch.int32) if rows_per_state else \
            torch.zeros(len(seqs), dtype=torch.int32)
        return BatchMeta(positions_t, rows_t, table, slot_fn(table, rows_t, positions_t, block_tokens).long(), cu,
                         state_ids, engine.max_context, decode).to(engine.device)

    prefill = meta([p for n in counts for p in range(n)], [r for r, n in enumerate(counts) for _ in range(n)],
                   counts, False)
    decode = meta([lengths[r] - 1 for r in range(decoders)], list(range(decoders)), [1] * decoders, True)
    return _Dummy(prefill, decode, decoders if rows_per_state else 0, (state_rows, next_row))


def _layers_used(kinds: list[str]) -> list[int]:
    """The layers the jobs run: the first and the last of each kind."""
    used = set()
    for kind in ("kda", "dsa"):
        layers = [i for i, k in enumerate(kinds) if k == kind]
        used |= {layers[0], layers[-1]} if layers else set()
    return sorted(used)


def _jobs(engine, dummy: _Dummy, generator: torch.Generator) -> list[tuple[str, list[Callable[[], None]]]]:
    """(name, steps) per job; the steps of one job run in order on one thread. The jobs run the layers of
    :func:`_layers_used` only: a prefill-shaped step on the first layer of each kind, a decode-shaped one on
    the last."""
    model, views = engine.model, engine.views
    dtype = next(model.parameters()).dtype
    kinds = list(model.config.layer_kinds)
    hidden = model.config.hidden_size
    glue = fused.on_by_default()  # eager steps run the model's fused glue: compile it here too

    def hidden_states(tokens: int) -> torch.Tensor:
        # random, never zeros: a kernel fed zeros may take a path the real inputs do not
        return torch.randn((tokens, hidden), generator=generator, device=engine.device).to(dtype)

    def layer_step(index: int, meta: BatchMeta) -> Callable[[], None]:
        """A layer's norm and attention; with the fused glue on for eager steps (``glue``) a KDA layer's whole
        block (its gates, norms and MLP activation are then fused kernels that compile on first use too) and a
        DSA layer's remaining glue on a thread of its own (:func:`glue_step`)."""
        block = model.blocks[index]
        x = hidden_states(meta.num_tokens)

        def step() -> None:
            if glue and block.kind == "kda":
                block(x, meta, views.layer(index), model.attention, model.check_ops)
            elif block.kind == "kda":
                block.attn(block.attn_norm(x), meta, views.layer(index), check=model.check_ops)
            else:
                block.attn(block.attn_norm(x), meta, views.layer(index), model.attention)
        return step

    def glue_step(index: int, meta: BatchMeta) -> Callable[[], None]:
        """A DSA layer's whole block around a stand-in attention that writes nothing and attends to nothing:
        the MLA and indexer input kernels, the residual norm and the MLP compile on their own thread, beside
        the attention's kernels (measured on the H200, 2026-12-01: one thread for both took 11.4 s)."""
        block = model.blocks[index]
        x = hidden_states(meta.num_tokens)
        stand_in = _NoAttention(block.attn.latent_rank)

        def step() -> None:
            block(x, meta, views.layer(index), stand_in, model.check_ops)
        return step

    def sparse_mla_step(index: int, meta: BatchMeta) -> Callable[[], None]:
        layer, cache = model.blocks[index].attn, views.layer(index)
        assert isinstance(cache, DsaLayerCache)
        tokens = meta.num_tokens
        q = torch.randn((tokens, layer.heads, layer.latent_rank + layer.rope_dim), generator=generator,
                        device=engine.device).to(dtype)
        mapped = int((meta.block_table >= 0).sum()) * cache.block_tokens
        # [T, topk] int32 as the fused top-k emits them: slots of mapped (snapshotted) blocks only
        picks = torch.randint(0, mapped, (tokens, layer.topk), generator=generator, device=engine.device)
        blocks = meta.block_table[meta.block_table >= 0].long()
        slots = (blocks[picks // cache.block_tokens] * cache.block_tokens + picks % cache.block_tokens).to(torch.int32)

        def step() -> None:
            ops.sparse_mla(q, cache.latent_pages, slots, kv_fmt=cache.latent_fmt, kv_scale=cache.latent_scale,
                           softmax_scale=layer.softmax_scale, check=False)
        return step

    jobs = []
    for kind, label in (("kda", "KDA"), ("dsa", "DSA")):
        layers = [i for i, k in enumerate(kinds) if k == kind]
        if not layers:
            continue
        # With one layer of the kind both jobs use it at once: they write different slots of its pages, and
        # where they share a KDA state the values are dummy anyway (nothing on the host depends on them).
        jobs += [(f"{label} prefill", [layer_step(layers[0], dummy.prefill)]),
                 (f"{label} decode", [layer_step(layers[-1], dummy.decode)])]
        if kind == "dsa" and glue:
            jobs += [("DSA glue prefill", [glue_step(layers[0], dummy.prefill)]),
                     ("DSA glue decode", [glue_step(layers[-1], dummy.decode)])]
        if kind == "dsa" and getattr(model.attention, "fused", True):
            # sparse MLA's own kernels compile beside the indexer's (inside dsa_attention they come last)
            jobs += [("sparse MLA prefill", [sparse_mla_step(layers[0], dummy.prefill)]),
                     ("sparse MLA decode", [sparse_mla_step(layers[-1], dummy.decode)])]
    return jobs


class _NoAttention:
    """The DSA attention in a glue job: stores nothing, returns zeros ``[T, H, latent_rank]`` in q's dtype
    (the MLA layer calls only ``write`` and ``attend``)."""

    def __init__(self, latent_rank: int):
        self.latent_rank = latent_rank

    def write(self, cache, latent, index_key, meta) -> None:
        pass

    def attend(self, cache, q_index, index_weights, q, meta, topk, softmax_scale) -> torch.Tensor:
        return q.new_zeros((q.shape[0], q.shape[1], self.latent_rank))


def _snapshot(engine, dummy: _Dummy) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(view, copy) of everything a job may write: in the layers it runs, the KDA recurrent and conv states
    of its state slots, the DSA latent and index pages of its blocks and the latent scale. Only those parts
    (not the whole rows: a row holds every layer, a state slot every KDA layer's state)."""
    saved = []
    start, end = dummy.blocks
    for index in _layers_used(list(engine.model.config.layer_kinds)):
        entry = engine.views.layer(index)
        if isinstance(entry, DsaLayerCache):
            parts = [entry.latent_pages[start:end], entry.index_pages[start:end]]
            parts += [entry.latent_scale] if entry.latent_scale is not None else []
        else:
            states = engine.model.blocks[index].attn.states(entry, check=False)
            parts = [states.recurrent[:dummy.states], states.conv[:dummy.states]]
        saved += [(view, view.clone()) for view in parts]
    return saved


def _run_job(steps: list[Callable[[], None]], device: torch.device) -> float:
    """Run one job's steps on this thread; returns its seconds."""
    start = time.perf_counter()
    with torch.no_grad():  # grad mode is per thread
        if device.type != "cuda":
            for step in steps:
                step()
            return time.perf_counter() - start
        stream = torch.cuda.Stream(device)  # its own stream: the jobs' launches do not queue behind each other
        with torch.cuda.device(device), torch.cuda.stream(stream):
            for step in steps:
                step()
        stream.synchronize()
    return time.perf_counter() - start


def warm_up(engine, prompt_lengths: list[int], *, show: bool = True, live: Optional[bool] = None,
            force: bool = False, max_threads: Optional[int] = None) -> WarmupResult:
    """Run every warm-up job once, concurrently, on ``engine`` (built, nothing run yet) for requests of
    ``prompt_lengths`` (in arrival order); restores every cache byte the jobs wrote. Returns what ran.

    ``show``/``live``: the "compile" bar (see :class:`~dsahal.engine.progress.PhaseProgress`).
    ``force``: run even where :func:`skip_reason` says it would compile nothing (tests on the CPU).
    ``max_threads``: at most this many jobs at once (default: one thread per job)."""
    reason = skip_reason(active_table().name, engine.device, engine.model.attention)
    if reason and not force:
        return WarmupResult(skipped=reason)
    start = time.perf_counter()
    cuda = engine.device.type == "cuda"
    generator = torch.Generator(device=engine.device).manual_seed(0)
    try:
        dummy = _dummy_batches(engine, list(prompt_lengths))
    except ValueError as exc:  # an engine smaller than its requests: they will wait for rows, as will the kernels
        return WarmupResult(skipped=str(exc))
    with torch.no_grad():
        jobs = _jobs(engine, dummy, generator)
        saved = _snapshot(engine, dummy)
    threads = max(1, min(len(jobs), max_threads or len(jobs)))
    say(f"compile  warming up the kernels on dummy inputs: {len(jobs)} jobs on {threads} threads "
        f"({', '.join(name for name, _ in jobs)}; --no-warmup skips)", enabled=show)
    bar = PhaseProgress("compile", len(jobs), "warm-up jobs", enabled=show, live=live)
    result = WarmupResult(jobs=[name for name, _ in jobs], threads=threads)
    if cuda:
        torch.cuda.synchronize(engine.device)  # inputs and snapshot are on the default stream
    try:
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="dsahal-warmup") as executor:
            pending = {executor.submit(contextvars.copy_context().run, _run_job, steps, engine.device): name
                       for name, steps in jobs}
            while pending:
                done, _ = concurrent.futures.wait(pending, timeout=POLL_S,
                                                  return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    name = pending.pop(future)
                    error = future.exception()
                    if error is not None:
                        message = (str(error).splitlines() or [""])[0][:300]
                        result.errors.append(f"{name}: {type(error).__name__}: {message}")
                    else:
                        result.job_seconds[name] = future.result()
                bar.advance(len(done))  # advance(0) redraws the clock
    finally:
        if cuda:
            torch.cuda.synchronize(engine.device)
        with torch.no_grad():
            for view, copy in saved:
                view.copy_(copy)
        if cuda:
            torch.cuda.synchronize(engine.device)
    result.seconds = time.perf_counter() - start
    bar.close(f"{len(result.errors)} failed: kernels of those compile on first use" if result.errors else "")
    for error in result.errors:
        say(f"warning: dsahal run warm-up job {error}", enabled=show)
    return result
