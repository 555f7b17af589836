"""Layout conversions between dsahal's paged uint8 caches and what AITER / FlyDSL kernels read.

Pure torch, device-agnostic: every function here runs (and is unit-tested) on the CPU. The vendor
kernels themselves are called in :mod:`.aiter_ops`; this module only moves bytes and metadata.

dsahal's layouts (see :mod:`dsahal.formats`):
- fp8 index key, 132 B per token: 128 float8_e4m3fn values, then one fp32 scale.
- mxfp4 index key, 68 B per token: 64 B of e2m1 pairs (dim 2i low nibble), then 4 UE8M0 scales.
- latent, bf16 (1152 B) or fp8 with one per-tensor scale (576 B).
- pages ``[num_blocks, block_tokens, token_bytes]``; slot = block * block_tokens + offset.
"""
from __future__ import annotations

import math

import torch

INDEX_DIM = 128
FP8_INDEX_BYTES = INDEX_DIM + 4
MXFP4_PACKED_BYTES = INDEX_DIM // 2
MXFP4_CHUNKS = 4  # 32-dim scale blocks per key = the kernel's K chunks of 16 packed bytes
E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_NEGATIVE_ZERO = 0x80  # e4m3fn's -0 is e4m3fnuz's NaN
FLYDSL_TILE = 64  # keys per FlyDSL sparse MLA split
LN2 = math.log(2.0)


# -- FP8 flavours -------------------------------------------------------------------------------

def e4m3fn_bytes_to_fnuz(fp8_bytes: torch.Tensor) -> torch.Tensor:
    """Reinterpret e4m3fn bytes for a kernel that reads e4m3fnuz (gfx942).

    The same bit pattern means half the value in fnuz (exponent bias 8 instead of 7) for every
    finite byte, so the caller doubles the matching scale; the only byte that changes is -0 (0x80),
    which is NaN in fnuz and becomes +0. e4m3fn's NaN (0x7F/0xFF) never occurs in a cache the
    format packers wrote.

    Args:
        fp8_bytes: uint8, any shape.

    Returns:
        uint8, same shape (a new tensor).
    """
    return torch.where(fp8_bytes == FP8_NEGATIVE_ZERO, torch.zeros_like(fp8_bytes), fp8_bytes)


# -- indexer on FP8 keys: AITER's deepgemm_fp8_paged_mqa_logits ------------------------------------

def fp8_index_pages_to_deepgemm(index_pages: torch.Tensor, *, fnuz: bool) -> torch.Tensor:
    """dsahal fp8 index pages -> the DeepGEMM paged layout AITER's paged MQA logits read.

    Per block AITER expects ``block_tokens * 128`` value bytes (token-major) followed by
    ``block_tokens`` fp32 scales, where dsahal stores each token's 128 values and scale together.

    Args:
        index_pages: ``[num_blocks, block_tokens, 132]`` uint8 (a strided view is fine).
        fnuz: convert the values for gfx942 (values reinterpreted, scales doubled).

    Returns:
        ``[num_blocks, block_tokens, 1, 132]`` uint8, contiguous (a copy).
    """
    blocks, block_tokens, _ = index_pages.shape
    values = index_pages[:, :, :INDEX_DIM].reshape(blocks, block_tokens * INDEX_DIM)
    scales = index_pages[:, :, INDEX_DIM:FP8_INDEX_BYTES].contiguous().view(torch.float32)  # [blocks, bt, 1]
    if fnuz:
        values = e4m3fn_bytes_to_fnuz(values)
        scales = scales * 2.0
    packed = torch.cat([values, scales.reshape(blocks, block_tokens).view(torch.uint8)], dim=1)
    return packed.reshape(blocks, block_tokens, 1, FP8_INDEX_BYTES)


def per_token_requests(block_table: torch.Tensor, req_ids: torch.Tensor, positions: torch.Tensor):
    """Present every query token to a paged-logits kernel as its own request of ``next_n = 1``.

    AITER's kernels take ``[batch, next_n]`` queries with one context length per request and a
    causal bound ``context_len - next_n + n`` for draft ``n``; dsahal gives each token its own
    position. One token per request expresses any batch exactly (varying draft counts, gaps).

    Returns:
        ``(context_lens [T] int32 = positions + 1, block_tables [T, max_blocks] int32)`` with
        unmapped blocks (-1) pointed at block 0 so the kernel reads memory it owns; the caller masks
        those columns afterwards (:func:`mask_invisible_logits`).
    """
    tables = block_table.index_select(0, req_ids.long()).to(torch.int32)
    tables = torch.where(tables < 0, torch.zeros_like(tables), tables).contiguous()
    return (positions.to(torch.int32) + 1).contiguous(), tables


def mask_invisible_logits(logits, block_table, req_ids, positions, block_tokens: int):
    """Set to -inf every column a token may not see: past its position, or on an unmapped block
    (the kernels leave those columns unwritten or computed from block 0).

    Args:
        logits: ``[T, max_context]`` fp32.

    Returns:
        ``[T, max_context]`` fp32 (a new tensor).
    """
    tokens, width = logits.shape
    columns = torch.arange(width, device=logits.device)
    visible = columns[None, :] <= positions.long()[:, None]
    blocks = (columns // block_tokens).clamp_max(block_table.shape[1] - 1)
    mapped = block_table.index_select(0, req_ids.long())[:, blocks] >= 0
    mapped &= (columns < block_table.shape[1] * block_tokens)[None, :]
    return torch.where(visible & mapped, logits, torch.full_like(logits, float("-inf")))


def quantize_index_queries_fp8(q: torch.Tensor, weights: torch.Tensor, fp8_dtype: torch.dtype):
    """Index queries -> FP8 for the paged logits kernel, per-(token, head) scales folded into weights.

    ``relu(s·q'·k) = s·relu(q'·k)`` for ``s > 0``, so ``weights · s`` keeps the score exact up to
    the rounding of ``q' = q / s``. Scales are powers of two (exact division). An fp8 ``q`` is
    already scaled by the caller: it passes through (its bytes converted for fnuz, which halves
    every value, so its weights double).

    Args:
        q: ``[T, H, 128]`` bf16/fp16/fp32/float8_e4m3fn. weights: ``[T, H]`` fp32.
        fp8_dtype: ``torch.float8_e4m3fn`` (gfx950) or ``torch.float8_e4m3fnuz`` (gfx942).

    Returns:
        ``(q_fp8 [T, 1, H, 128] fp8_dtype, weights [T, H] fp32)``.
    """
    fnuz = fp8_dtype == torch.float8_e4m3fnuz
    if q.dtype == torch.float8_e4m3fn:
        q_bytes = q.contiguous().view(torch.uint8)
        if fnuz:
            q_bytes, weights = e4m3fn_bytes_to_fnuz(q_bytes), weights * 2.0
        return q_bytes.view(fp8_dtype).unsqueeze(1), weights.float().contiguous()
    top = torch.finfo(fp8_dtype).max
    amax = q.float().abs().amax(dim=-1).clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / top)))
    q_fp8 = (q.float() / scale[..., None]).clamp(-top, top).to(fp8_dtype)
    return q_fp8.unsqueeze(1).contiguous(), (weights.float() * scale).contiguous()


# -- indexer on MXFP4 keys: FlyDSL's pa_mqa_logits_fp4 (gfx950) --------------------------------------

def mxfp4_index_pages_to_preshuffled(index_pages: torch.Tensor, ntpw: int = 4):
    """dsahal mxfp4 index pages -> the preshuffled layout of AITER's ``flydsl_pa_mqa_logits_fp4``.

    Kernel ABI (AITER ``op_tests/test_flydsl_pa_mqa_logits_fp4.py``): values
    ``[num_blocks, K_TILES=1, 4 chunks, block_tokens, 16 B]`` (a chunk is 32 dims = 16 packed bytes,
    the K axes ahead of the token axis); scales ``[num_blocks, 1, 4, block_tokens]`` UE8M0 where,
    within a chunk, byte ``j * ntpw + n`` holds token ``n * (block_tokens / ntpw) + j`` (four
    consecutive bytes cover four token groups, one dword load). Nibble order is unchanged.

    Args:
        index_pages: ``[num_blocks, block_tokens, 68]`` uint8; block_tokens a multiple of ``ntpw``.

    Returns:
        ``(kv_cache [num_blocks, 1, 4, block_tokens, 16] uint8, kv_scale [num_blocks, 1, 4, block_tokens] uint8)``.
    """
    blocks, block_tokens, _ = index_pages.shape
    values = index_pages[:, :, :MXFP4_PACKED_BYTES].reshape(blocks, block_tokens, MXFP4_CHUNKS, 16)
    kv_cache = values.permute(0, 2, 1, 3).contiguous().unsqueeze(1)
    scales = index_pages[:, :, MXFP4_PACKED_BYTES:MXFP4_PACKED_BYTES + MXFP4_CHUNKS].permute(0, 2, 1)
    scales = scales.reshape(blocks, MXFP4_CHUNKS, ntpw, block_tokens // ntpw).transpose(-1, -2)
    kv_scale = scales.contiguous().reshape(blocks, MXFP4_CHUNKS, block_tokens).unsqueeze(1)
    return kv_cache, kv_scale


def _e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """fp32 values already in [-6, 6] -> nearest e2m1 codes (ties to the even code)."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=values.device)
    magnitude = values.abs()
    distance = (magnitude[..., None] - grid).abs()
    # Prefer the even code on exact ties: add a tiny penalty to odd codes.
    distance = distance + torch.tensor([0, 1, 0, 1, 0, 1, 0, 1], device=values.device) * 1e-7
    code = distance.argmin(dim=-1).to(torch.uint8)
    return code | (torch.signbit(values).to(torch.uint8) << 3)


def quantize_index_queries_mxfp4(q: torch.Tensor):
    """Index queries -> MXFP4 (e2m1 + one UE8M0 scale per 32 dims) in the kernel's q layouts.

    The scale is the smallest power of two putting the block's largest magnitude at or below 6.

    Args:
        q: ``[T, H, 128]`` float (H a multiple of 16).

    Returns:
        ``(q_packed [T, 1, H, 64] uint8, q_scale [T, 1, 1, 4, 16, pad] uint8, scales [T, H, 4] fp32)``.
        ``q_scale`` is AITER's preshuffled order: heads split as ``(m_tiles, 16)``, the 16-head axis
        ahead of the tile axis, tiles padded to a multiple of 4. ``scales`` are the decoded scales
        (for messages and tests).
    """
    tokens, heads, _ = q.shape
    blocks = q.float().reshape(tokens, heads, MXFP4_CHUNKS, 32)
    amax = blocks.abs().amax(dim=-1).clamp_min(2.0**-126)
    exponent = torch.ceil(torch.log2(amax / E2M1_MAX)).clamp(-127, 127)
    scales = torch.exp2(exponent)
    codes = _e2m1_codes((blocks / scales[..., None]).clamp(-E2M1_MAX, E2M1_MAX)).reshape(tokens, heads, INDEX_DIM)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    e8m0 = (exponent + 127).to(torch.uint8)  # [T, H, 4]
    m_tiles = heads // 16
    pad = -(-m_tiles // 4) * 4
    shuffled = e8m0.reshape(tokens, 1, m_tiles, 16, 1, MXFP4_CHUNKS).permute(0, 1, 4, 5, 3, 2)
    shuffled = torch.nn.functional.pad(shuffled, (0, pad - m_tiles)).contiguous()
    return packed.unsqueeze(1).contiguous(), shuffled, scales


# -- sparse MLA: AITER mla_decode_fwd (page size 1) and FlyDSL sparse decode ------------------------

def slots_to_ragged(slots: torch.Tensor):
    """``[T, K]`` slots (-1 skipped) -> AITER's ragged page-size-1 metadata, one query per "request".

    Returns:
        ``(qo_indptr [T+1], kv_indptr [T+1], kv_indices [nnz], kv_last_page_lens [T])``, all int32;
        ``kv_indices`` lists each row's valid slots in their original order (duplicates kept).
    """
    tokens = slots.shape[0]
    valid = slots >= 0
    counts = valid.sum(dim=1)
    kv_indptr = torch.zeros(tokens + 1, dtype=torch.int32, device=slots.device)
    kv_indptr[1:] = torch.cumsum(counts, dim=0)
    kv_indices = slots[valid].to(torch.int32)  # row-major: each row's slots in order
    qo_indptr = torch.arange(tokens + 1, dtype=torch.int32, device=slots.device)
    last_page_lens = torch.ones(tokens, dtype=torch.int32, device=slots.device)
    return qo_indptr, kv_indptr, kv_indices, last_page_lens


def latent_rows(kv_pages: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The latent pages as ``[num_slots, 1, 1, 576]`` of ``dtype`` (bf16, or fp8 for the 576 B format),
    without a copy. The vendor kernels address slot ``s`` at ``s * 576`` elements, so the pages must
    be one dense run: raises ValueError for a strided view (the verifiers reject those first)."""
    blocks, block_tokens, token_bytes = kv_pages.shape
    if not latent_pages_are_dense(kv_pages):
        raise ValueError(f"dsahal.sparse_mla: AITER/FlyDSL need dense latent pages, got strides {kv_pages.stride()}")
    flat = kv_pages.reshape(blocks * block_tokens, token_bytes).view(dtype)
    return flat.reshape(blocks * block_tokens, 1, 1, flat.shape[1])


def latent_pages_are_dense(kv_pages: torch.Tensor) -> bool:
    _, block_tokens, token_bytes = kv_pages.shape
    return kv_pages.stride(2) == 1 and kv_pages.stride(1) == token_bytes and kv_pages.stride(0) == block_tokens * token_bytes


def empty_rows_to_zero(o: torch.Tensor, lse: torch.Tensor, slots: torch.Tensor):
    """dsahal's rule for a row with no valid slot (o = 0, lse = -inf), whatever a kernel left there."""
    empty = ~(slots >= 0).any(dim=1)
    o = torch.where(empty[:, None, None], torch.zeros_like(o), o)
    lse = torch.where(empty[:, None], torch.full_like(lse, float("-inf")), lse)
    return o, lse


def pad_slots_to_tiles(slots: torch.Tensor, tile: int = FLYDSL_TILE) -> torch.Tensor:
    """``[T, K]`` -> ``[T, ceil(K / tile) * tile]`` int32, padded with -1 (masked by the kernel)."""
    tokens, width = slots.shape
    padded = max(tile, -(-width // tile) * tile)
    out = torch.full((tokens, padded), -1, dtype=torch.int32, device=slots.device)
    out[:, :width] = slots
    return out


def quantize_q_fp8_per_tensor(q: torch.Tensor):
    """``q`` -> (float8_e4m3fn q, fp32 scale) with one power-of-two scale for the whole tensor
    (the FlyDSL sparse kernel takes no q scale: it is folded into the softmax scale)."""
    amax = q.float().abs().amax().clamp_min(1e-30)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    return (q.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).contiguous(), scale


def lse_from_log2_partials(partial_lse: torch.Tensor) -> torch.Tensor:
    """``[T, G, H]`` base-2 log-sum-exp of each split -> ``[T, H]`` natural log-sum-exp of the row.
    All-masked splits (-inf) contribute nothing; a row of only -inf stays -inf."""
    return torch.logsumexp(partial_lse.float() * LN2, dim=1)
