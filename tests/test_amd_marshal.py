"""The AMD vendor paths' marshalling, checked on the CPU without faking any result.

Each vendor kernel (AITER / FlyDSL) is replaced by a plain-torch emulation of its documented ABI —
the layouts its source and op-tests define — and fed exactly what our path marshals. The path's
result must equal the dsahal reference op on the same inputs. This checks our side of each call
(layout conversion, metadata, scale folding, masking, empty rows); the kernels themselves have never
run here (no ROCm), which the backend reports as unverified.
"""
import math

import pytest
import torch

from dsahal.backends.amd import marshal, vendor_ops
from dsahal.formats import index_format, latent_format
from dsahal.reference.indexer import indexer_score as reference_indexer_score
from dsahal.reference.sparse_mla import sparse_mla as reference_sparse_mla
from dsahal.reference.topk import topk as reference_topk

LOG2E = 1.0 / math.log(2.0)
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


# -- paged inputs -----------------------------------------------------------------------------------

def paged(kind, fmt, values, block_tokens, scale=None, spare_blocks=2, seed=0):
    """Write ``values [N, dim]`` into shuffled physical blocks; returns (pages, block_table [1, blocks])."""
    spec = index_format(fmt) if kind == "index" else latent_format(fmt)
    count = values.shape[0]
    blocks = -(-count // block_tokens)
    order = torch.randperm(blocks + spare_blocks, generator=torch.Generator().manual_seed(seed))[:blocks]
    pages = torch.randint(0, 255, (blocks + spare_blocks, block_tokens, spec.token_bytes), dtype=torch.uint8)
    records = spec.pack(values, scale)
    for position in range(count):
        pages[order[position // block_tokens], position % block_tokens] = records[position]
    return pages, order.to(torch.int32)[None, :]


def e4m3_values(shape, gen, amax_per_row=True):
    """Random float8_e4m3fn-representable values, each last-dim row holding one +-448."""
    values = torch.randn(shape, generator=gen).mul(60).clamp(-440, 440).to(torch.float8_e4m3fn).float()
    if amax_per_row:
        values[..., 0] = 448.0 * torch.sign(torch.randn(shape[:-1], generator=gen)).clamp_min(0).mul(2).sub(1)
    return values


# -- AITER deepgemm_fp8_paged_mqa_logits ------------------------------------------------------------

def emulate_deepgemm_fp8_paged_mqa_logits(q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices,
                                          max_model_len, KVBlockSize=1, **_):
    """ABI (aiter/ops/triton/attention/pa_mqa_logits.py): kv_cache [blocks, bs, 1, 132] viewed as
    [blocks, bs*132]: bs*128 fp8 values then bs fp32 scales; q [batch, next_n, H, 128]; row
    b*next_n+n sees keys 0..ctx-next_n+n; other columns are left unwritten (garbage here)."""
    assert q_fp8.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) and kv_cache.dtype == torch.uint8
    assert weights.dtype == out_logits.dtype == torch.float32
    assert context_lens.dtype == kv_indices.dtype == torch.int32 and kv_indices.is_contiguous()
    batch, next_n, heads, dim = q_fp8.shape
    blocks, bs, _, index_dim = kv_cache.shape
    assert bs == KVBlockSize and out_logits.shape == (batch * next_n, max_model_len)
    flat = kv_cache.reshape(blocks, bs * index_dim)
    values = flat[:, : bs * dim].contiguous().view(q_fp8.dtype).float().reshape(blocks, bs, dim)
    scales = flat[:, bs * dim:].contiguous().view(torch.float32).reshape(blocks, bs)
    out_logits.fill_(1e30)
    for b in range(batch):
        for n in range(next_n):
            last = int(context_lens[b]) - next_n + n
            s = torch.arange(last + 1)
            block = kv_indices[b, s // bs].long()
            keys = values[block, s % bs] * scales[block, s % bs][:, None]
            out_logits[b * next_n + n, : last + 1] = weights[b * next_n + n] @ torch.relu(q_fp8[b, n].float() @ keys.T)


def indexer_inputs(fmt, gen, tokens=4, heads=16, block_tokens=16, context=50, unmapped_block=1):
    keys = torch.randn(context, 128, generator=gen)
    pages, block_table = paged("index", fmt, keys, block_tokens, seed=int(torch.randint(0, 99, (1,), generator=gen)))
    block_table[0, unmapped_block] = -1  # a hole: those keys must score -inf
    positions = torch.tensor([context - 1, 3, 20, 37][:tokens], dtype=torch.int32)
    req_ids = torch.zeros(tokens, dtype=torch.int32)
    weights = torch.randn(tokens, heads, generator=gen)
    return pages, block_table, req_ids, positions, weights


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=["gfx950", "gfx942-fnuz"])
def test_fp8_indexer_marshalling_matches_the_reference(monkeypatch, fp8_dtype):
    gen = torch.Generator().manual_seed(1)
    pages, block_table, req_ids, positions, weights = indexer_inputs("fp8", gen)
    q = e4m3_values((4, 16, 128), gen).to(torch.float8_e4m3fn)  # fp8 q: its scale is already in the weights
    monkeypatch.setitem(vendor_ops.KERNELS, "aiter.indexer_fp8", emulate_deepgemm_fp8_paged_mqa_logits)
    monkeypatch.setattr(vendor_ops, "_fp8_dtype", lambda tensor: fp8_dtype)
    got = vendor_ops.indexer_score_fp8(q, weights, pages, block_table, req_ids, positions, "fp8", 64)
    want = reference_indexer_score(q, weights, pages, block_table, req_ids, positions, "fp8", 64)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)


def test_fp8_indexer_quantises_bf16_queries_with_scales_folded_into_weights(monkeypatch):
    gen = torch.Generator().manual_seed(2)
    pages, block_table, req_ids, positions, weights = indexer_inputs("fp8", gen)
    q = (e4m3_values((4, 16, 128), gen) * 2.0**-5).to(torch.bfloat16)  # exactly e4m3 after a 2^-5 scale
    monkeypatch.setitem(vendor_ops.KERNELS, "aiter.indexer_fp8", emulate_deepgemm_fp8_paged_mqa_logits)
    got = vendor_ops.indexer_score_fp8(q, weights, pages, block_table, req_ids, positions, "fp8", 64)
    want = reference_indexer_score(q, weights, pages, block_table, req_ids, positions, "fp8", 64)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)


def test_e4m3fn_bytes_read_as_fnuz_are_half_the_value_and_never_nan():
    every_byte = torch.arange(256, dtype=torch.uint8)
    finite = ~torch.isnan(every_byte.view(torch.float8_e4m3fn).float())
    fnuz = marshal.e4m3fn_bytes_to_fnuz(every_byte).view(torch.float8_e4m3fnuz).float()
    assert not torch.isnan(fnuz[finite]).any()
    assert torch.equal(fnuz[finite] * 2, every_byte.view(torch.float8_e4m3fn).float()[finite])


# -- FlyDSL flydsl_pa_mqa_logits_fp4 (MXFP4 keys, gfx950) ---------------------------------------------

def _e2m1(codes):
    magnitude = E2M1_MAGNITUDES[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def emulate_flydsl_pa_mqa_logits_fp4(q_fp4, q_scale, kv_cache, kv_scale, block_tables, weights, context_lens,
                                     max_seq_len, *, weight_scale=1.0, next_n=1, kv_block_size=64, out=None, **_):
    """ABI (aiter op_tests/test_flydsl_pa_mqa_logits_fp4.py): kv_cache [blocks, 1, 4, bs, 16]: chunk c
    (dims 32c..32c+31) of token t in kv_cache[block, 0, c, t]; kv_scale [blocks, 1, 4, bs] with
    token t's byte at (t % (bs/4)) * 4 + t // (bs/4); q_scale [B, NN, 1, 4, 16, pad]: head 16m+i,
    chunk c at [.., c, i, m]; low nibble = even dim; out pre-filled -inf, causal per row."""
    assert q_fp4.dtype == q_scale.dtype == kv_cache.dtype == kv_scale.dtype == torch.uint8
    assert weights.dtype == torch.bfloat16 and out.dtype == torch.float32  # weights are loaded as bf16
    assert block_tables.dtype == context_lens.dtype == torch.int32
    batch, nn, heads, packed = q_fp4.shape
    bs = kv_block_size
    assert block_tables.shape[1] * bs >= -(-max_seq_len // 256) * 256  # whole 256-key chunks stay in the table
    quarter = bs // 4
    out.fill_(float("-inf"))
    for b in range(batch):
        for n in range(nn):
            q = torch.empty(heads, 128)
            for h in range(heads):
                codes = torch.stack([q_fp4[b, n, h] & 15, q_fp4[b, n, h] >> 4], dim=-1).reshape(128)
                for c in range(4):
                    e = int(q_scale[b, n, 0, c, h % 16, h // 16])
                    q[h, 32 * c:32 * c + 32] = _e2m1(codes[32 * c:32 * c + 32]) * 2.0 ** (e - 127)
            last = int(context_lens[b]) - nn + n
            for s in range(last + 1):
                block, t = int(block_tables[b, s // bs]), s % bs
                key = torch.empty(128)
                for c in range(4):
                    chunk = kv_cache[block, 0, c, t]
                    codes = torch.stack([chunk & 15, chunk >> 4], dim=-1).reshape(32)
                    e = int(kv_scale[block, 0, c, (t % quarter) * 4 + t // quarter])
                    key[32 * c:32 * c + 32] = _e2m1(codes) * 2.0 ** (e - 127)
                out[b * nn + n, s] = weight_scale * (weights[b * nn + n].float() @ torch.relu(q @ key))
    return out


def mxfp4_exact_queries(tokens, heads, gen):
    """Queries MXFP4 represents exactly: e2m1 grid values x 2^e per 32 dims, each block holding a +-6."""
    codes = torch.randint(0, 16, (tokens, heads, 4, 32), generator=gen, dtype=torch.uint8)
    codes[..., 0] = torch.where(torch.rand(tokens, heads, 4, generator=gen) < 0.5, 7, 15).to(torch.uint8)
    exponents = torch.randint(-3, 3, (tokens, heads, 4, 1), generator=gen).float()
    return (_e2m1(codes) * torch.exp2(exponents)).reshape(tokens, heads, 128)


def test_mxfp4_indexer_marshalling_matches_the_reference(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    pages, block_table, req_ids, positions, weights = indexer_inputs("mxfp4", gen, block_tokens=16, context=50)
    weights = weights.to(torch.bfloat16).float()  # the kernel reads bf16 weights: keep them exact here
    q = mxfp4_exact_queries(4, 16, gen)
    monkeypatch.setitem(vendor_ops.KERNELS, "flydsl.indexer_mxfp4", emulate_flydsl_pa_mqa_logits_fp4)
    got = vendor_ops.indexer_score_mxfp4(q, weights, pages, block_table, req_ids, positions, "mxfp4", 64)
    want = reference_indexer_score(q, weights, pages, block_table, req_ids, positions, "mxfp4", 64)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)


def test_mxfp4_query_quantisation_is_exact_on_representable_values():
    q = mxfp4_exact_queries(2, 32, torch.Generator().manual_seed(4))
    packed, shuffled, scales = marshal.quantize_index_queries_mxfp4(q)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(2, 1, 32, 4, 32)
    decoded = _e2m1(codes) * scales.reshape(2, 1, 32, 4, 1)
    assert torch.equal(decoded.reshape(2, 32, 128), q)
    assert shuffled.shape == (2, 1, 1, 4, 16, 4)  # 32 heads = 2 tiles of 16, padded to 4


# -- AITER mla_decode_fwd (sparse, page size 1) ------------------------------------------------------

def emulate_mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                           page_size=1, nhead_kv=1, sm_scale=None, return_lse=False, **_):
    """ABI (aiter/mla.py): kv_buffer [num_pages, page_size, nhead_kv, 576]; request b = queries
    qo_indptr[b]..qo_indptr[b+1] over pages kv_indices[kv_indptr[b]:kv_indptr[b+1]]; lse natural log.
    An empty request's outputs are not defined (NaN here)."""
    assert page_size == 1 and nhead_kv == 1 and max_seqlen_q == 1 and return_lse
    assert q.dtype == kv_buffer.dtype == o.dtype == torch.bfloat16 and kv_buffer.shape[1:3] == (1, 1)
    assert qo_indptr.dtype == kv_indptr.dtype == kv_indices.dtype == kv_last_page_lens.dtype == torch.int32
    kv = kv_buffer.reshape(kv_buffer.shape[0], -1).float()
    lse = torch.full(o.shape[:2], float("nan"))
    for b in range(qo_indptr.numel() - 1):
        chosen = kv_indices[kv_indptr[b]:kv_indptr[b + 1]].long()
        for t in range(int(qo_indptr[b]), int(qo_indptr[b + 1])):
            if chosen.numel() == 0:
                o[t] = float("nan")
                continue
            logits = sm_scale * (q[t].float() @ kv[chosen].T)
            lse[t] = torch.logsumexp(logits, dim=-1)
            o[t] = (torch.softmax(logits, dim=-1) @ kv[chosen, :512]).to(o.dtype)
    return o, lse


def mla_inputs(fmt, gen, tokens, heads, slots_per_row, context=70, block_tokens=16, kv_scale=None):
    latents = torch.randn(context, 576, generator=gen)
    pages, block_table = paged("latent", fmt, latents, block_tokens, scale=kv_scale, spare_blocks=1)
    positions = torch.randint(0, context, (tokens, slots_per_row), generator=gen)
    positions[0, :5] = -1  # padding
    positions[1, 1] = positions[1, 0]  # a slot listed twice counts twice
    positions[-1] = -1  # a row with nothing to attend to
    blocks = block_table[0].long()[positions.clamp_min(0) // block_tokens]
    slots = torch.where(positions >= 0, blocks * block_tokens + positions % block_tokens, -1).to(torch.int32)
    return pages, slots


def test_aiter_sparse_mla_marshalling_matches_the_reference(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    pages, slots = mla_inputs("bf16", gen, tokens=4, heads=16, slots_per_row=24)
    q = torch.randn(4, 16, 576, generator=gen).to(torch.bfloat16)
    monkeypatch.setitem(vendor_ops.KERNELS, "aiter.sparse_mla", emulate_mla_decode_fwd)
    o, lse = vendor_ops.sparse_mla_aiter(q, pages, slots, "bf16", None, 0.07)
    want_o, want_lse = reference_sparse_mla(q, pages, slots, "bf16", None, 0.07)
    torch.testing.assert_close(o.float(), want_o.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-4)
    assert torch.equal(o[-1], torch.zeros_like(o[-1])) and torch.isneginf(lse[-1]).all()


# -- FlyDSL flydsl_sparse_mla_decode (fp8 latent, 16 heads, gfx950) -----------------------------------

def emulate_flydsl_sparse_mla_decode(q, kv, indices, out, sm_scale, *, partial_output, partial_lse):
    """ABI (aiter/ops/flydsl/sparse_mla_decode_kernels.py): q [T, 16, 576] fp8, kv [P, 576] fp8 at unit
    scale, indices [T, 64·ng] (negative = masked); producer g owns tiles g, g+G, g+2G... and writes a
    normalised bf16 partial and its base-2 lse; the reducer merges them into out (bf16)."""
    assert q.dtype == kv.dtype == torch.float8_e4m3fn and indices.dtype == torch.int32
    assert out.dtype == partial_output.dtype == torch.bfloat16 and partial_lse.dtype == torch.float32
    assert q.is_contiguous() and kv.is_contiguous() and q.shape[1:] == (16, 576) and kv.shape[1:] == (576,)
    tokens, groups = partial_lse.shape[:2]
    tiles = indices.shape[1] // 64
    assert indices.shape[1] % 64 == 0 and partial_output.shape == (tokens, groups, 16, 512)
    keys = kv.reshape(-1, 576).float()
    for t in range(tokens):
        for g in range(groups):
            owned = torch.cat([indices[t, 64 * tile:64 * tile + 64] for tile in range(g, tiles, groups)]).long()
            valid = owned >= 0
            logits2 = (q[t].float() @ keys[owned.clamp_min(0)].T) * sm_scale * LOG2E
            logits2[:, ~valid] = float("-inf")
            partial_lse[t, g] = torch.logsumexp(logits2 / LOG2E, dim=-1) * LOG2E
            weights = torch.nan_to_num(torch.exp2(logits2 - partial_lse[t, g][:, None]))
            partial_output[t, g] = (weights @ keys[owned.clamp_min(0), :512]).to(torch.bfloat16)
        total = torch.logsumexp(partial_lse[t] / LOG2E, dim=0) * LOG2E
        share = torch.nan_to_num(torch.exp2(partial_lse[t] - total[None, :]))
        out[t] = (share[:, :, None] * partial_output[t].float()).sum(dim=0).to(torch.bfloat16)
    return out


def test_flydsl_sparse_mla_marshalling_matches_the_reference(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    kv_scale = torch.tensor(2.0**-6)
    pages, slots = mla_inputs("fp8", gen, tokens=3, heads=16, slots_per_row=70, kv_scale=kv_scale)
    q = (e4m3_values((3, 16, 576), gen, amax_per_row=False) * 2.0**-9)
    q[0, 0, 0] = 448.0 * 2.0**-9  # per-tensor scale 2^-9: q is exactly e4m3 after it
    monkeypatch.setitem(vendor_ops.KERNELS, "flydsl.sparse_mla", emulate_flydsl_sparse_mla_decode)
    o, lse = vendor_ops.sparse_mla_flydsl(q, pages, slots, "fp8", kv_scale, 0.05)
    want_o, want_lse = reference_sparse_mla(q, pages, slots, "fp8", kv_scale, 0.05)
    torch.testing.assert_close(o, want_o, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-4)
    assert torch.isneginf(lse[-1]).all()


def test_flydsl_slots_are_padded_to_whole_64_key_tiles():
    padded = marshal.pad_slots_to_tiles(torch.arange(70, dtype=torch.int32).reshape(1, 70))
    assert padded.shape == (1, 128) and torch.equal(padded[0, 70:], torch.full((58,), -1, dtype=torch.int32))


# -- AITER top_k_per_row ----------------------------------------------------------------------------

def emulate_top_k_per_row_prefill(logits, row_starts, row_ends, indices, values, num_rows, stride0, stride1, k=2048,
                                  stable=False):
    """ABI (aiter/ops/topk.py): k best of logits[r, start:end] (ties: smaller index, stable=True),
    emitted in ascending index order; -inf entries are ordinary values to it. What it writes past a
    short row is unspecified: index 0 here, the most misleading choice."""
    assert logits.dtype == torch.float32 and row_starts.dtype == row_ends.dtype == indices.dtype == torch.int32
    assert stable and (stride0, stride1) == logits.stride()
    indices.fill_(0)
    for r in range(num_rows):
        row = logits[r, int(row_starts[r]):int(row_ends[r])]
        order = sorted(range(row.numel()), key=lambda i: (-float(row[i]), i))[:k]
        indices[r, : len(order)] = torch.tensor(sorted(order), dtype=torch.int32)


def test_aiter_topk_output_follows_the_op_contract(monkeypatch):
    gen = torch.Generator().manual_seed(7)
    scores = torch.randint(0, 5, (5, 40), generator=gen).float()
    scores[1, ::2] = float("-inf")
    scores[2] = float("-inf")
    lengths = torch.tensor([40, 40, 40, 3, 0], dtype=torch.int32)
    monkeypatch.setitem(vendor_ops.KERNELS, "aiter.topk", emulate_top_k_per_row_prefill)
    got = vendor_ops.topk(scores, lengths, 12)
    want = reference_topk(scores, lengths, 12)
    for row in range(5):
        valid = got[row][got[row] >= 0]
        assert torch.equal(got[row][valid.numel():], torch.full((12 - valid.numel(),), -1, dtype=torch.int32))
        assert sorted(valid.tolist()) == sorted(want[row][want[row] >= 0].tolist())
