"""A small DSA layer call shared by the tests of the nvidia backend's fused layer: two requests of a 40-key context
in 8-token blocks (one block-table row padded with -1), five query tokens interleaved between them, FP8 index keys,
bf16 latents, 4 index heads, 4 heads, top-k 6."""
from __future__ import annotations


def small_layer_args(seed: int) -> tuple:
    """``dsahal.ops.dsa_attention``'s arguments in its spec's order: (q_index, index_weights, index_pages, q,
    kv_pages, block_table, req_ids, positions, index_fmt, kv_fmt, kv_scale, topk, max_context, softmax_scale)."""
    import torch

    from dsahal.formats import index_format, latent_format

    gen = torch.Generator().manual_seed(seed)
    index_pages = index_format("fp8").pack(torch.randn(6 * 8, 128, generator=gen)).view(6, 8, -1)
    kv_pages = latent_format("bf16").pack(torch.randn(6 * 8, 576, generator=gen)).view(6, 8, -1)
    table = torch.tensor([[2, 0, 5, 1, 4], [3, 1, 0, -1, -1]], dtype=torch.int32)
    req = torch.tensor([0, 0, 1, 0, 1], dtype=torch.int32)
    pos = torch.tensor([3, 39, 17, 25, 0], dtype=torch.int32)
    q_index, weights = torch.randn(5, 4, 128, generator=gen), torch.rand(5, 4, generator=gen)
    q = torch.randn(5, 4, 576, generator=gen)
    return (q_index, weights, index_pages, q, kv_pages, table, req, pos, "fp8", "bf16", None, 6, 40, 0.1)
