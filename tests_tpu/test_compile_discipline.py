"""Compile discipline, read off torch-xla's own metrics: a decode step is one graph with no host
round trip, and decode steps whose context lengths fall in one bucket reuse one executable."""
from __future__ import annotations

import torch
import torch_xla

from dsahal import ops
from dsahal.backends.tpu.buckets import length_bucket
from dsahal.formats import cache_format

from conftest import compile_count, execute_count, host_fallback_counters, on_reference

BLOCK_TOKENS, NUM_BLOCKS, REQUESTS = 16, 20, 2


def decode_cache(seed: int):
    """Host-built paged caches (fp8 index keys, bf16 latents) full of random tokens."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.arange(NUM_BLOCKS * BLOCK_TOKENS, dtype=torch.int32)
    caches = []
    for kind, fmt in (("index", "fp8"), ("latent", "bf16")):
        spec = cache_format(kind, fmt)
        pages = torch.zeros(NUM_BLOCKS, BLOCK_TOKENS, spec.token_bytes, dtype=torch.uint8)
        on_reference(ops.cache_write, torch.randn(len(slots), spec.dim, generator=gen), slots, pages,
                     kind=kind, fmt=fmt)
        caches.append(pages)
    block_table = torch.arange(REQUESTS * 8, dtype=torch.int32).reshape(REQUESTS, 8)  # 128 positions each
    return caches, block_table


def decode_step(xla, caches, block_table, context_lengths, seed):
    """One decode step of a DSA layer for every request at its context length: write the new tokens into
    the device-resident caches, then indexer -> top-k -> sparse MLA; one ``torch_xla.sync()``."""
    gen = torch.Generator().manual_seed(seed)
    positions = torch.tensor(context_lengths, dtype=torch.int32) - 1
    max_context = length_bucket(max(context_lengths), minimum=32)
    index_pages, kv_pages = caches  # already on the device: only the step's small inputs move
    # The step first writes each request's new token (its key and latent) into the paged caches.
    rows = block_table[torch.arange(REQUESTS), positions // BLOCK_TOKENS]
    slots = (rows * BLOCK_TOKENS + positions % BLOCK_TOKENS).to(torch.int32).to(xla)
    ops.cache_write(torch.randn(REQUESTS, 128, generator=gen).to(xla), slots, index_pages, kind="index", fmt="fp8",
                    check=False)
    ops.cache_write(torch.randn(REQUESTS, 576, generator=gen).to(xla), slots, kv_pages, kind="latent", fmt="bf16",
                    check=False)
    o, lse = ops.dsa_attention(
        torch.randn(REQUESTS, 4, 128, generator=gen).to(xla), torch.randn(REQUESTS, 4, generator=gen).to(xla),
        index_pages, torch.randn(REQUESTS, 2, 576, generator=gen).to(xla), kv_pages, block_table.to(xla),
        torch.arange(REQUESTS, dtype=torch.int32).to(xla), positions.to(xla),
        index_fmt="fp8", kv_fmt="bf16", topk=16, max_context=max_context, softmax_scale=0.05, check=False)
    torch_xla.sync()
    return o, lse, max_context


def test_decode_steps_in_one_context_bucket_reuse_one_compiled_graph(xla):
    import dsahal

    caches, block_table = decode_cache(seed=0)
    caches = [c.to(xla) for c in caches]
    with dsahal.use_backend("tpu") as table, dsahal.observe(dsahal.CallLog()) as log:
        decode_step(xla, caches, block_table, [40, 35], seed=1)  # warm-up: compiles the 64 bucket
        compiles, executions, fallbacks = compile_count(), execute_count(), host_fallback_counters()
        buckets = set()
        for step, lengths in enumerate(([41, 36], [50, 63], [64, 33], [57, 60])):
            *_, bucket = decode_step(xla, caches, block_table, lengths, seed=2 + step)
            buckets.add(bucket)
        assert buckets == {64}
        assert compile_count() == compiles, "a decode step within one bucket compiled a new graph"
        assert execute_count() == executions + 4, "a decode step ran more than one graph (a host round trip)"
        assert host_fallback_counters() == fallbacks, "an op ran on the host instead of on XLA"
        decode_step(xla, caches, block_table, [65, 100], seed=9)  # the next bucket: exactly one compile
        assert compile_count() == compiles + 1
        assert log.count("dsa_attention", fallback=True) == 0 and log.count("dsa_attention") > 0
        assert table.entries["dsa_attention"].status == "native"


def test_a_decode_step_matches_the_reference(xla):
    import dsahal

    caches, block_table = decode_cache(seed=3)
    with dsahal.use_backend("tpu"):
        o, lse, max_context = decode_step(xla, [c.to(xla) for c in caches], block_table, [45, 120], seed=4)
    # The same step on the host with the reference: same draws, in the same order.
    gen = torch.Generator().manual_seed(4)
    positions = torch.tensor([44, 119], dtype=torch.int32)
    slots = (block_table[torch.arange(REQUESTS), positions // BLOCK_TOKENS] * BLOCK_TOKENS
             + positions % BLOCK_TOKENS).to(torch.int32)
    on_reference(ops.cache_write, torch.randn(REQUESTS, 128, generator=gen), slots, caches[0], kind="index", fmt="fp8")
    on_reference(ops.cache_write, torch.randn(REQUESTS, 576, generator=gen), slots, caches[1], kind="latent",
                 fmt="bf16")
    q_index, weights = torch.randn(REQUESTS, 4, 128, generator=gen), torch.randn(REQUESTS, 4, generator=gen)
    q = torch.randn(REQUESTS, 2, 576, generator=gen)
    expected = on_reference(ops.dsa_attention, q_index, weights, caches[0], q, caches[1], block_table,
                            torch.arange(REQUESTS, dtype=torch.int32), positions,
                            index_fmt="fp8", kv_fmt="bf16", topk=16, max_context=max_context, softmax_scale=0.05)
    assert torch.allclose(o.cpu(), expected[0], atol=1e-4, rtol=1e-4)
    assert torch.allclose(lse.cpu(), expected[1], atol=1e-4, rtol=1e-5)


def test_kda_decode_steps_reuse_one_graph_and_update_the_pool_on_device(xla):
    import dsahal

    heads, key_dim, value_dim, batch = 2, 16, 8, 3
    state_pool = torch.zeros(6, heads, key_dim, value_dim).to(xla)
    state_ids = torch.tensor([4, -1, 1], dtype=torch.int32).to(xla)

    def step(seed):
        gen = torch.Generator().manual_seed(seed)
        inputs = [torch.randn(batch, heads, key_dim, generator=gen), torch.randn(batch, heads, key_dim, generator=gen),
                  torch.randn(batch, heads, value_dim, generator=gen), -torch.rand(batch, heads, key_dim, generator=gen),
                  torch.rand(batch, heads, generator=gen)]
        ops.kda_decode(*[x.to(xla) for x in inputs], state_pool, state_ids, check=False)
        torch_xla.sync()

    with dsahal.use_backend("tpu"):
        step(0)
        compiles, executions = compile_count(), execute_count()
        for seed in range(1, 5):
            step(seed)
        assert compile_count() == compiles
        assert execute_count() == executions + 4
    assert bool((state_pool.cpu()[[4, 1]] != 0).all()) and bool((state_pool.cpu()[[0, 2, 3, 5]] == 0).all())
