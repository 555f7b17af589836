"""Random (never zero) caches the H200 scripts of this folder time and check on: index keys written by the
Triton encoder, latent pages packed by the format's own packer. ``device`` is the script's ("cpu" in
``--cpu-smoke`` runs under the Triton interpreter)."""
BLOCK_TOKENS = 64


def index_pool(torch, fmt: str, blocks: int, gen, device, block_tokens: int = BLOCK_TOKENS):
    """``[blocks, block_tokens, token_bytes]`` index keys (``fmt`` fp8 / mxfp4 / bf16) written by the Triton
    cache write from N(0, 1) + 1e-3 values."""
    from dsahal.backends.triton_kernels.cache_write import cache_write
    from dsahal.formats import index_format

    spec = index_format(fmt)
    pages = torch.empty(blocks, block_tokens, spec.token_bytes, dtype=torch.uint8, device=device)
    tokens, chunk = blocks * block_tokens, 1 << 20
    for start in range(0, tokens, chunk):
        rows = min(chunk, tokens - start)
        values = torch.randn(rows, 128, device=device, generator=gen) + 1e-3
        cache_write(values, torch.arange(start, start + rows, device=device), pages, "index", fmt, None)
    return pages


def latent_pools(torch, formats, pool_tokens: int, device, block_tokens: int = BLOCK_TOKENS) -> dict:
    """Per format: (pages ``[blocks, block_tokens, token_bytes]`` uint8, tensor scale or None), latents
    N(0, 1) + 1e-3 (never exactly zero), one seeded generator per format."""
    from dsahal.formats import latent_format

    blocks = pool_tokens // block_tokens
    pools = {}
    for fmt in formats:
        spec = latent_format(fmt)
        scale = torch.tensor(4.0 / 448.0, device=device) if spec.needs_tensor_scale else None
        pages = torch.empty(blocks * block_tokens, spec.token_bytes, dtype=torch.uint8, device=device)
        gen = torch.Generator(device=device).manual_seed(1)
        for start in range(0, pages.shape[0], 1 << 18):
            rows = min(1 << 18, pages.shape[0] - start)
            pages[start:start + rows] = spec.pack(torch.randn(rows, 576, device=device, generator=gen) + 1e-3, scale)
        pools[fmt] = (pages.view(blocks, block_tokens, spec.token_bytes), scale)
    return pools


def decode_batch(torch, requests: int, per_request: int, context: int, blocks: int, gen, device,
                 block_tokens: int = BLOCK_TOKENS):
    """A paged decode batch over a pool of ``blocks`` blocks: (block table ``[requests, ceil(context /
    block_tokens)]`` int32, each request its own random blocks; request ids ``[requests * per_request]``;
    positions: the last ``per_request`` positions of a ``context``-key request)."""
    per_req_blocks = -(-context // block_tokens)
    table = torch.randperm(blocks, device=device, generator=gen)[: requests * per_req_blocks]
    table = table.view(requests, per_req_blocks).to(torch.int32)
    req = torch.arange(requests, device=device, dtype=torch.int32).repeat_interleave(per_request)
    pos = (context - per_request + torch.arange(per_request, device=device, dtype=torch.int32)).repeat(requests)
    return table, req, pos
