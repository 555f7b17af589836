"""Bench case "model decode step": one decode step of the whole model, eager and replayed from a CUDA graph.

The model (``k31-pro-slice`` by default: one GPU's share of K3.1 Pro at TP8, 3 KDA + 1 DSA layers,
vocab 163840) is built on the meta device and materialised on the GPU, as ``dsahal run`` does, with
its large matrices drawn there directly (drawing 2.3 G parameters on the host would take longer than
the whole case). No prefill runs: the cache holds random valid records (bf16 latents, FP8 index keys
with positive scales) and random KDA states, and the step decodes one token per request at position
``context`` of each request. A decode step's cost does not depend on the cache values except through
top-k (the radix select's candidate counts follow the score distribution; random keys give a spread
of scores, like real ones), so this times the step a served batch would run, in a few seconds of
set-up instead of a prefill of ``requests x context`` tokens.

``ms`` is the eager step (every op with ``check=False``; its first run, in the warm-up, packs the weights of
the projections that share an input into one buffer each: :mod:`dsahal.model.packed`); ``graph ms`` replays the same step from a
graph captured by :class:`dsahal.engine.cuda_graph.DecodeGraphs`, the engine's own runner, timed the
same way (median of ``triton.testing.do_bench``, L2 flushed before each run). Both repeat the step on
the same inputs: it rewrites the same slot and advances the same KDA states each time.

Before timing, :func:`check_model_decode` runs the ``tiny`` config at a reduced shape: the backend's
eager step against the reference backend's (float32, tight; bfloat16, loose), the step the graph runner
captures (5 requests padded to 8 rows) against the unpadded step, including that the padding rows
changed no cache row, and the graph's replay against the same step run eagerly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import load_config
from ..engine.batch import write_slots
from ..engine.cuda_graph import DecodeGraphs, DecodeInputs
from ..engine.factory import build_cache
from ..model import HybridModel, LocalDsaAttention, ModelCache
from ..model.weights import RESIDUAL_WRITERS, _draw
from ..model.meta import materialize, on_meta
from ..registry import use_backend
from .case_types import Built
from .inputs import random_pages
from .measure import relative_error

BLOCK_TOKENS = 64
SMALL_PARAM = 1 << 20  # parameters up to this size are drawn by init_weights' own rules on the host


@torch.no_grad()
def init_weights_on_device(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """:func:`dsahal.model.init_weights`' distributions, the large matrices drawn on the model's device
    (not the same numbers as ``init_weights``: a bench needs the scales, not the values)."""
    device = next(model.parameters()).device
    host = torch.Generator().manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    layers = model.config.num_layers
    for name, param in model.named_parameters():
        if param.numel() <= SMALL_PARAM or param.dim() != 2:
            param.copy_(_draw(name, param, host, layers).to(param.dtype))
            continue
        std = 1.0 if name == "embed.weight" else param.shape[1] ** -0.5
        if name.endswith(RESIDUAL_WRITERS):
            std /= math.sqrt(2 * layers)
        param.normal_(0.0, std, generator=gen)
    return model


@dataclass
class DecodeSetup:
    """A model over a randomly filled cache and one decode step's inputs (every tensor on the device)."""

    model: HybridModel
    cache: object
    views: ModelCache
    inputs: DecodeInputs
    block_table: torch.Tensor  # [requests, max_blocks] int32
    max_context: int

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """The eager decode step; logits ``[requests, vocab]`` fp32."""
        i = self.inputs
        return self.model.step(i.token_ids, i.positions, i.req_ids, self.block_table, i.slots, i.cu_seqlens,
                               i.state_ids, self.views, max_context=self.max_context, decode=True)

    def graphs(self, sizes=None) -> DecodeGraphs:
        return DecodeGraphs(self.model, self.views, max_batch=self.block_table.shape[0],
                            max_blocks=self.block_table.shape[1], max_context=self.max_context,
                            device=self.block_table.device, sizes=sizes)


def decode_setup(config, contexts: list[int], device, *, dtype=torch.bfloat16, latent_fmt="bf16", index_fmt="fp8",
                 seed: int = 0, check: bool = False) -> DecodeSetup:
    """Request ``b`` has ``contexts[b]`` random past tokens in the cache and decodes its next one.

    ``check``: validate op arguments in the step (off for timing)."""
    device = torch.device(device)
    with on_meta():
        model = HybridModel(config, attention=LocalDsaAttention(check=check), check_ops=check)
    model = init_weights_on_device(materialize(model, device).to(dtype).eval(), seed)
    requests, longest = len(contexts), max(contexts) + 1
    cache = build_cache(config, max_batch=requests, max_context=longest, latent_fmt=latent_fmt, index_fmt=index_fmt,
                        block_tokens=BLOCK_TOKENS, device=device)
    max_blocks = math.ceil(longest / BLOCK_TOKENS)
    block_table = torch.full((requests, max_blocks), -1, dtype=torch.int32)
    state_ids = [int(cache.allocate_state()) for _ in contexts]  # states need aligned runs of rows: first
    for row, context in enumerate(contexts):
        blocks = cache.allocate_blocks(math.ceil((context + 1) / BLOCK_TOKENS))
        block_table[row, :len(blocks)] = torch.tensor([int(b) for b in blocks], dtype=torch.int32)
    # Pages of every row first, then the allocated states over their rows (page and state views both
    # cover every row: a state written to an unallocated slot would land on some request's pages).
    # Drawn from ``seed`` like the weights and states (random_pages draws from the global generator): a check on
    # this step sees the same pages every run, not an unlucky near-tie of the indexer's top-k now and then.
    devices = list(range(torch.cuda.device_count())) if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for layer in config.dsa_layers:
            cache.latent_pages(layer).copy_(random_pages("latent", latent_fmt, cache.num_rows, BLOCK_TOKENS, device))
            cache.index_pages(layer).copy_(random_pages("index", index_fmt, cache.num_rows, BLOCK_TOKENS, device))
    ids = torch.tensor(state_ids, dtype=torch.long, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for layer in config.kda_layers:
        states = cache.kda_states(layer)
        states[ids] = torch.randn((len(ids), *states.shape[1:]), generator=gen, device=device) * 0.05
    positions = torch.tensor(contexts, dtype=torch.int32)
    rows = torch.arange(requests, dtype=torch.int32)
    host = torch.Generator().manual_seed(seed)
    inputs = DecodeInputs(
        token_ids=torch.randint(0, config.vocab_size, (requests,), generator=host).to(device),
        positions=positions.to(device), req_ids=rows.to(device),
        slots=write_slots(block_table, rows, positions, BLOCK_TOKENS).to(device),
        cu_seqlens=torch.arange(requests + 1, dtype=torch.int32, device=device),
        state_ids=torch.tensor(state_ids, dtype=torch.int32, device=device), batch=requests)
    views = ModelCache.from_packed(cache, config, latent_fmt, index_fmt)
    return DecodeSetup(model, cache, views, inputs, block_table.to(device), max_blocks * BLOCK_TOKENS)


def step_cost(setup: DecodeSetup, contexts: list[int]) -> tuple[float, float]:
    """(bytes, FLOPs) a decode step must at least move and compute: every weight but the embedding table
    (one row per request of it), the index keys of every past token, the top-k latents, the KDA states
    read and written; 2 FLOPs per weight per request, the indexer and the sparse MLA."""
    config, model = setup.model.config, setup.model
    requests = len(contexts)
    embed = model.embed.weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) - embed.numel() * embed.element_size()
    weights += requests * embed.shape[1] * embed.element_size()
    if config.tie_embeddings:  # the LM head is the embedding table, read in full
        weights += embed.numel() * embed.element_size()
    dsa = len(config.dsa_layers)
    index_bytes = setup.cache.index_pages(config.dsa_layers[0]).shape[-1]
    latent_bytes = setup.cache.latent_pages(config.dsa_layers[0]).shape[-1]
    selected = [min(config.index_topk, c + 1) for c in contexts]
    cache = dsa * (sum(c + 1 for c in contexts) * index_bytes + sum(selected) * latent_bytes)
    states = 2 * len(config.kda_layers) * requests * config.kda_num_heads * config.kda_head_dim ** 2 * 4
    matmul = 2.0 * requests * (sum(p.numel() for p in model.parameters()) - embed.numel())
    attention = dsa * sum(2.0 * (c + 1) * config.index_heads * config.index_dim +
                          2.0 * k * config.num_heads * (576 + 512) for c, k in zip(contexts, selected))
    return float(weights + cache + states), matmul + attention


def _changed_rows(before: torch.Tensor, after: torch.Tensor) -> set[int]:
    return set((after != before).any(dim=1).nonzero().flatten().tolist())


CHECK_CONTEXTS = [300, 41, 150, 77, 200]  # tiny's top-k is 64: some rows select, one sees fewer tokens


@torch.no_grad()
def _against_reference(config, device, backend: str, dtype, tol: float):
    """(ok, detail, setup, logits, pool after the backend's step): the backend's eager step vs the reference's."""
    setup = decode_setup(config, CHECK_CONTEXTS, device, dtype=dtype, check=True)
    pool = setup.cache.pool
    before = pool.clone()
    with use_backend(backend):
        ours = setup.step()
    after = pool.clone()
    pool.copy_(before)
    with use_backend("reference"):
        want = setup.step()
    pool.copy_(before)
    err = relative_error(ours, want)
    name = str(dtype).replace("torch.", "")
    return err < tol, f"{name} logits rel err vs reference {err:.1e} (tol {tol:.0e})", setup, ours, after


@torch.no_grad()
def check_model_decode(device, backend: str, config_name: str = "tiny") -> tuple[bool, str]:
    """The backend's decode step vs the reference's at a reduced shape, in float32 (tight: the op paths
    agree to rounding, so a wrong op shows) and on CUDA in bfloat16 too (the timed dtype; loose: bf16
    roundings compound through the layers). Then, in the timed dtype, the step the graph runner
    captures (5 requests padded to 8 rows, run over its static buffers) vs the unpadded step, and that
    the padding rows changed no cache row; on CUDA also its graph replay, likewise."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    config = load_config(config_name)
    ok, detail, setup, ours, after_ours = _against_reference(config, device, backend, torch.float32, 1e-3)
    details = [detail]
    if cuda:
        ok16, detail16, setup, ours, after_ours = _against_reference(config, device, backend, torch.bfloat16, 1e-1)
        ok, details = ok and ok16, details + [detail16]
    tol = 5e-2 if cuda else 1e-4
    pool, rows = setup.cache.pool, len(CHECK_CONTEXTS)
    before = pool.clone()  # _against_reference left the pool as it was before its steps
    owned = _changed_rows(before, after_ours)
    with use_backend(backend):
        graphs = setup.graphs(sizes=[8])
        if cuda:
            graphs.capture(8)  # warm-up and capture write nothing: every row a padding row
        graphs.load(setup.inputs, setup.block_table)
        padded = graphs.forward(8)[:rows].clone()  # what is captured, run eagerly
        harmless = _changed_rows(before, pool) <= owned
        pool.copy_(before)
        if cuda:
            replayed = graphs.replay(8)[:rows].clone()
            torch.cuda.synchronize(device)
            harmless = harmless and _changed_rows(before, pool) <= owned
            pool.copy_(before)
    pad_err = relative_error(padded, ours)
    ok = ok and pad_err < tol and harmless
    details.append(f"{rows} rows padded to 8 vs unpadded rel err {pad_err:.1e} (tol {tol:.0e}), padding rows "
                   f"wrote nothing: {harmless}")
    if not cuda:
        return ok, "; ".join(details) + "; graph replay not checked (not on CUDA)"
    same_err = relative_error(replayed, padded)
    ok = ok and same_err < 1e-3 and bool(torch.isfinite(replayed).all())
    details.append(f"graph replay vs the same step eager rel err {same_err:.1e} (tol 1e-03)")
    return ok, "; ".join(details)


def build_model_decode(config_name: str, requests: int, context: int):
    """The bench ``build``: the eager step, its bytes and FLOPs, and a graph factory (capture, then replay)."""
    def build(device):
        contexts = [context] * requests
        setup = decode_setup(load_config(config_name), contexts, device)
        nbytes, flops = step_cost(setup, contexts)

        def graph():
            graphs = setup.graphs(sizes=[requests])
            graphs.capture(requests)
            graphs.load(setup.inputs, setup.block_table)
            return lambda: graphs.replay(requests)

        return Built(run=setup.step, bytes=nbytes, flops=flops, graph=graph)
    return build
