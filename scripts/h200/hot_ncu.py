"""Run the hot kernels a few times each, at the bench shapes, for Nsight Compute to profile::

    ncu --clock-control none -k regex:indexer_tiles --launch-skip 2 --launch-count 1 --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        python3 scripts/h200/hot_ncu.py indexer

Cases (argv, default all): ``indexer`` (FP8 keys, FP8 queries, 64 requests x 1 token at 128K keys, the
backend's block-tile configuration), ``indexer2`` / ``indexer5`` (the same at 64 x 2 / 64 x 5), ``indexer_bf16`` /
``indexer_bf16_5`` (bf16 queries, 64 x 1 / 64 x 5), ``mxfp4`` / ``mxfp4_5`` (MXFP4 keys, FP8 queries, 64 x 1 / 64 x
5; before the eighteenth session the ninth's prepared ``alu`` 28 by a direct launch), ``mxfp4_bf16`` (MXFP4 keys, bf16
queries, 64 x 1), ``prefill`` (one request's 4096 tokens at positions 28K..32K, the chunked prefill shape),
``indexer5_ws`` (64 x 5, the warp-specialised Gluon variant: ``indexer_gluon`` ``warp_specialized``), ``indexer5_64``
(64 x 5 at 64 index heads), ``small_heads`` (sparse MLA, few-heads
kernel, fp8_ds_mla latents, H = 16, 64 x 5 tokens x 2048 slots into a 1M-token pool), ``wgmma16`` / ``wgmma12`` (the
same call on the route's kernel, ``sparse_mla_wgmma`` at the backend's launch, H = 16 / 12), ``nvfp4_16`` (the same
on NVFP4 latents, ``sparse_mla_wgmma_fp4``, H = 16). Each case runs three
calls (the first compiles); prints only the cases' order, so ncu's report is the output.
"""
import sys

import torch

import pools as cache_pools  # scripts/h200/pools.py

DEVICE = "cuda"


def indexer(per_request, requests=64, context=128 * 1024, q_dtype=torch.float8_e4m3fn, fmt="fp8", more=None,
            heads=32):
    """``requests`` requests of ``per_request`` query tokens each at the end of a ``context``-token sequence
    (decode; one request of 4096 tokens at 32K is the chunked-prefill shape), ``fmt`` keys, ``q_dtype`` queries,
    the backend's configuration (``more``: its Gluon options from 3 tokens a request, ``gluon_more``, replaced)."""
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels.indexer import indexer_score

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    block_tokens = 64
    per_req_blocks = context // block_tokens
    blocks = requests * per_req_blocks + 64
    pages = cache_pools.index_pool(torch, fmt, blocks, gen, DEVICE, block_tokens)
    table = torch.randperm(blocks, device=DEVICE, generator=gen)[: requests * per_req_blocks]
    table = table.view(requests, per_req_blocks).to(torch.int32)
    req = torch.arange(requests, device=DEVICE, dtype=torch.int32).repeat_interleave(per_request)
    pos = (context - per_request + torch.arange(per_request, device=DEVICE, dtype=torch.int32)).repeat(requests)
    tokens = requests * per_request
    q = torch.randn(tokens, heads, 128, device=DEVICE, generator=gen).to(q_dtype)
    w = torch.randn(tokens, heads, device=DEVICE, generator=gen)
    cfg = dict(indexer_config(heads, q.dtype, fmt))
    if more is not None:
        cfg["block_tiles"] = dict(cfg["block_tiles"], gluon_more=more)
    for _ in range(3):
        indexer_score(q, w, pages, table, req, pos, fmt, context, **cfg)


def small_heads():
    from dsahal.backends.triton_kernels import sparse_mla_small_heads as chunked

    pages, scale = cache_pools.latent_pools(torch, ("fp8_ds_mla",), 1 << 20, DEVICE)["fp8_ds_mla"]
    gen = torch.Generator(device=DEVICE).manual_seed(16)
    tokens, heads = 320, 16
    slots = torch.randint(0, pages.shape[0] * 64, (tokens, 2048), device=DEVICE, dtype=torch.int32, generator=gen)
    q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
    cfg = chunked.hopper_config(heads, "fp8_ds_mla", q.dtype)
    for _ in range(3):
        chunked.sparse_mla_small_heads(q, pages, slots, "fp8_ds_mla", scale, 192**-0.5, **cfg)


def wgmma(heads, fmt="fp8_ds_mla"):
    """The few-heads route's wgmma kernel for ``fmt`` (``sparse_mla_wgmma``; ``sparse_mla_wgmma_fp4`` for nvfp4) as the
    backend launches it for 320 tokens, at ``heads``."""
    from dsahal.backends.nvidia import ops

    launch = ops.sparse_mla_wgmma_fp4 if fmt == "nvfp4" else ops.sparse_mla_wgmma
    pages, _ = cache_pools.latent_pools(torch, (fmt,), 1 << 20, DEVICE)[fmt]
    gen = torch.Generator(device=DEVICE).manual_seed(16)
    tokens = 320
    slots = torch.randint(0, pages.shape[0] * 64, (tokens, 2048), device=DEVICE, dtype=torch.int32, generator=gen)
    q = torch.randn(tokens, heads, 576, device=DEVICE, generator=gen).to(torch.bfloat16)
    for _ in range(3):
        launch(q, pages, slots, fmt, None, 192**-0.5)


BF16 = torch.bfloat16
CASES = {"indexer": lambda: indexer(1), "indexer2": lambda: indexer(2), "indexer5": lambda: indexer(5),
         "indexer_bf16": lambda: indexer(1, q_dtype=BF16), "indexer_bf16_2": lambda: indexer(2, q_dtype=BF16),
         "indexer_bf16_5": lambda: indexer(5, q_dtype=BF16),
         "mxfp4": lambda: indexer(1, fmt="mxfp4"), "mxfp4_5": lambda: indexer(5, fmt="mxfp4"),
         "mxfp4_bf16": lambda: indexer(1, q_dtype=BF16, fmt="mxfp4"),
         "prefill": lambda: indexer(4096, requests=1, context=32 * 1024), "small_heads": small_heads,
         "wgmma16": lambda: wgmma(16), "wgmma12": lambda: wgmma(12), "nvfp4_16": lambda: wgmma(16, "nvfp4"),
         # twenty-seventh session: the warp-specialised Gluon variant at 64 x 5 (a producer warp, 3 programs a SM)
         "indexer5_ws": lambda: indexer(5, more=dict(stages=6, depth=1, maxnreg=80, head_sum_mma=True,
                                                     warp_specialized=True)),
         "indexer5_64": lambda: indexer(5, heads=64)}  # (64 index heads: DeepSeek-V3.2's indexer)

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        print("case", name, flush=True)
        CASES[name]()
    torch.cuda.synchronize()
