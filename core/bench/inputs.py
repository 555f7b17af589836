"""Random (never zero) inputs for the bench: paged caches, block tables, decode batches.

Large caches are filled with random bytes that are valid in their format (no FP8 NaN codes,
positive finite scales) instead of packing fp32 values, so a 10 GB cache builds in milliseconds.
"""
from __future__ import annotations

import torch

from ..formats import cache_format

FP8_NAN_MASK = 0x7F  # e4m3 bytes 0x7F and 0xFF are NaN


def random_fp8_bytes(shape, device) -> torch.Tensor:
    raw = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    # Clear the low mantissa bit of NaN codes (0x7F -> 0x7E = 448) and keep magnitudes moderate.
    return torch.where((raw & FP8_NAN_MASK) == FP8_NAN_MASK, raw - 1, raw) & 0xBF


def random_pages(kind: str, fmt: str, num_blocks: int, block_tokens: int, device) -> torch.Tensor:
    """``[num_blocks, block_tokens, token_bytes]`` uint8 of random valid records."""
    spec = cache_format(kind, fmt)
    tokens = num_blocks * block_tokens
    if fmt == "bf16":
        values = torch.randn(tokens, spec.dim, device=device, dtype=torch.bfloat16)
        return values.view(torch.uint8).view(num_blocks, block_tokens, spec.token_bytes)
    pages = torch.empty(tokens, spec.token_bytes, dtype=torch.uint8, device=device)
    if fmt == "fp8" and kind == "latent":
        pages.copy_(random_fp8_bytes((tokens, spec.token_bytes), device))
    elif fmt == "fp8" and kind == "index":
        pages[:, :128] = random_fp8_bytes((tokens, 128), device)
        pages[:, 128:] = (torch.rand(tokens, 1, device=device) * 0.01 + 0.001).view(torch.uint8)
    elif fmt == "fp8_ds_mla":
        pages[:, :512] = random_fp8_bytes((tokens, 512), device)
        pages[:, 512:528] = (torch.rand(tokens, 4, device=device) * 0.01 + 0.001).view(torch.uint8)
        pages[:, 528:] = torch.randn(tokens, 64, device=device, dtype=torch.bfloat16).view(torch.uint8)
    else:
        values = torch.randn(tokens, spec.dim, device=device)
        pages.copy_(spec.pack(values, None))
    return pages.view(num_blocks, block_tokens, spec.token_bytes)


def decode_batch(requests: int, tokens_per_request: int, context: int, block_tokens: int, device):
    """A decode batch: request-major tokens whose last position is ``context - 1``, each request's
    blocks a random permutation of its own range of physical blocks.

    Returns (block_table [B, blocks] int32, req_ids [T] int32, positions [T] int32, num_blocks).
    """
    blocks_per_request = -(-context // block_tokens)
    num_blocks = requests * blocks_per_request
    perm = torch.randperm(num_blocks, device=device, dtype=torch.int64).to(torch.int32)
    block_table = perm.view(requests, blocks_per_request)
    req_ids = torch.arange(requests, device=device, dtype=torch.int32).repeat_interleave(tokens_per_request)
    offsets = torch.arange(tokens_per_request, device=device, dtype=torch.int32).repeat(requests)
    positions = context - tokens_per_request + offsets
    return block_table, req_ids, positions, num_blocks


def random_slots(tokens: int, k: int, num_slots: int, device, invalid_fraction: float = 0.0) -> torch.Tensor:
    slots = torch.randint(0, num_slots, (tokens, k), device=device, dtype=torch.int32)
    if invalid_fraction:
        slots[torch.rand(tokens, k, device=device) < invalid_fraction] = -1
    return slots
