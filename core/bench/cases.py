"""The bench cases: one per (op, shape) of docs/performance.md.

A case builds its inputs on the device and returns what to time (the backend's op through the
public ``dsahal.ops`` API with ``check=False``), the plain-torch baseline, an installed peer, and
the bytes and FLOPs that define its floor. Before timing, :func:`check_op` runs the same op on
fresh random inputs at a reduced shape and compares it with the reference backend.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Optional

import torch

from .. import ops
from ..registry import use_backend
from . import baselines, peers
from .case_types import Built, Case
from .inputs import decode_batch, random_pages, random_slots
from .measure import relative_error

MLA_SCALE = 192**-0.5
INDEX_HEADS = 32
TOPK = 2048


# ---------------------------------------------------------------- correctness at reduced shapes
@contextlib.contextmanager
def batch_invariant_mode(on: bool = True):
    """``DSAHAL_BATCH_INVARIANT`` set for the calls inside, then restored to what it was. Backends read the
    mode when the registry is built (never per call), so the registry is rebuilt on entry and on exit,
    keeping the selected backend."""
    from ..registry import active_table, reset, set_backend

    selected = active_table().name
    before = os.environ.get("DSAHAL_BATCH_INVARIANT")
    os.environ["DSAHAL_BATCH_INVARIANT"] = "1" if on else "0"
    reset()
    set_backend(selected)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DSAHAL_BATCH_INVARIANT", None)
        else:
            os.environ["DSAHAL_BATCH_INVARIANT"] = before
        reset()
        set_backend(selected)


def _compare(fn_backend, fn_reference, backend: str):
    torch.manual_seed(1234)
    with use_backend(backend):
        got = fn_backend()
    with use_backend("reference"):
        want = fn_reference()
    return got, want


def check_indexer(device, backend, index_fmt="fp8", q_dtype=torch.float8_e4m3fn):
    block_tokens, context = 64, 1000
    block_table, req_ids, positions, num_blocks = decode_batch(3, 4, context, block_tokens, device)
    block_table[1, 3] = -1  # an unmapped block
    pages = random_pages("index", index_fmt, num_blocks, block_tokens, device)
    q = torch.randn(req_ids.shape[0], INDEX_HEADS, 128, device=device).to(q_dtype)
    w = torch.rand(req_ids.shape[0], INDEX_HEADS, device=device)
    args = (q, w, pages, block_table, req_ids, positions)
    kw = dict(index_fmt=index_fmt, max_context=context + 24)
    with use_backend(backend):
        got = ops.indexer_score(*args, **kw)
    with use_backend("reference"):
        want = ops.indexer_score(q.float() if q_dtype == torch.float8_e4m3fn else q, *args[1:], **kw)
    same_mask = torch.equal(torch.isfinite(got), torch.isfinite(want))
    finite = torch.isfinite(want)
    err = relative_error(got[finite], want[finite])
    # FP8 MMAs (FP8 queries; bf16 ones on FP8 / MXFP4 keys, split into two e4m3 parts) sum at Hopper's FP8
    # accumulator precision: ~1.3e-4 relative on the H200 with signed weights (scripts/h200/indexer_alu_sweep.py);
    # the head sums as tf32 MMAs (nvidia's Gluon route from 3 tokens a request and for MXFP4 keys, twenty-sixth
    # session) truncate each relu'd score to tf32: 3.2-4.1e-4 here (these weights are >= 0, so the truncation's
    # bias, 2^-11 a term on average, does not cancel), at most ~2^-10
    tol = 1e-4 if q_dtype not in (torch.float8_e4m3fn, torch.bfloat16) or index_fmt == "bf16" else 1e-3
    return same_mask and err < tol, f"-inf mask equal={same_mask}, rel err {err:.1e} (tolerance {tol:.0e})"


def check_topk(device, backend):
    scores = torch.randn(6, 5000, device=device)
    scores[1] = torch.randint(0, 5, (5000,), device=device).float()  # heavy ties
    scores[2, 3000:] = float("-inf")
    lengths = torch.tensor([5000, 5000, 5000, 4000, 100, 0], device=device, dtype=torch.int32)
    with use_backend(backend):
        got = ops.topk(scores, lengths, 257)
    with use_backend("reference"):
        want = ops.topk(scores, lengths, 257)
    same = torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)
    return same, f"exact reference set (tie rule) = {same}"


def check_sparse_mla(device, backend, kv_fmt="bf16", heads=128, q_dtype=torch.bfloat16):
    block_tokens, num_blocks, tokens, k = 64, 40, 5, 300
    pages = random_pages("latent", kv_fmt, num_blocks, block_tokens, device)
    scale = torch.tensor(0.5, device=device) if kv_fmt == "fp8" else None
    q = torch.randn(tokens, heads, 576, device=device).to(q_dtype)
    slots = random_slots(tokens, k, num_blocks * block_tokens, device, invalid_fraction=0.2)
    slots[-1] = -1  # an empty row
    kw = dict(kv_fmt=kv_fmt, kv_scale=scale, softmax_scale=MLA_SCALE)
    with use_backend(backend):
        o, lse = ops.sparse_mla(q, pages, slots, **kw)
    with use_backend("reference"):
        o_ref, lse_ref = ops.sparse_mla(q, pages, slots, **kw)
    err = relative_error(o, o_ref)
    lse_err = float((lse[:-1] - lse_ref[:-1]).abs().max())
    empty_ok = bool((o[-1] == 0).all()) and bool(torch.isneginf(lse[-1]).all())
    tol = 2e-2 if q_dtype == torch.bfloat16 else 1e-4
    return err < tol and lse_err < 2e-2 and empty_ok, f"o rel err {err:.1e}, lse max err {lse_err:.1e}, empty row ok {empty_ok}"


def check_kda_decode(device, backend, batch=6, heads=4, dtype=torch.float32):
    pool = torch.randn(10, heads, 128, 128, device=device) * 0.1
    q, k = (torch.randn(batch, heads, 128, device=device).to(dtype) for _ in range(2))
    v = torch.randn(batch, heads, 128, device=device).to(dtype)
    g = -torch.rand(batch, heads, 128, device=device)
    beta = torch.rand(batch, heads, device=device)
    ids = torch.tensor([3, -1, 0, 7, 9, 5][:batch], device=device, dtype=torch.int32)
    pool_a, pool_b = pool.clone(), pool.clone()
    with use_backend(backend):
        o = ops.kda_decode(q, k, v, g, beta, pool_a, ids)
    with use_backend("reference"):
        o_ref = ops.kda_decode(q, k, v, g, beta, pool_b, ids)
    err, state_err = relative_error(o, o_ref), relative_error(pool_a, pool_b)
    return err < 1e-4 and state_err < 1e-5, f"o rel err {err:.1e}, state rel err {state_err:.1e}"


def check_kda_prefill(device, backend, dtype=torch.float32, timed_route=False):
    """fp32 inputs over 200 tokens (the exact kernels); with ``timed_route`` also bf16 q / k / v over 900 tokens
    (sequences of 600, 0 and 300, fp32 gates as the model's): the route a GPU bench times at 8 x 4096 (on nvidia the
    chunked kernel, which takes 16-bit calls over 512 tokens), at the conformance suite's bf16 bound (2^-6)."""
    ok, detail = _kda_prefill_error(device, backend, dtype, [0, 70, 70, 200], 2e-3)
    if timed_route:
        ok_16, detail_16 = _kda_prefill_error(device, backend, torch.bfloat16, [0, 600, 600, 900], 2.0 ** -6)
        ok, detail = ok and ok_16, f"{detail}; bf16 inputs, 900 tokens: {detail_16}"
    return ok, detail


def _kda_prefill_error(device, backend, dtype, offsets, tol):
    heads = 4
    cu = torch.tensor(offsets, device=device, dtype=torch.int32)
    tokens = int(cu[-1])
    pool = torch.randn(5, heads, 128, 128, device=device) * 0.1
    q, k = (torch.randn(tokens, heads, 128, device=device).to(dtype) for _ in range(2))
    v = torch.randn(tokens, heads, 128, device=device).to(dtype)
    g = -torch.rand(tokens, heads, 128, device=device) * 0.2
    beta = torch.rand(tokens, heads, device=device)
    ids = torch.tensor([4, 0, -1], device=device, dtype=torch.int32)
    pool_a, pool_b = pool.clone(), pool.clone()
    with use_backend(backend):
        o = ops.kda_prefill(q, k, v, g, beta, cu, pool_a, ids)
    with use_backend("reference"):
        o_ref = ops.kda_prefill(q, k, v, g, beta, cu, pool_b, ids)
    err, state_err = relative_error(o, o_ref), relative_error(pool_a, pool_b)
    return err < tol and state_err < tol, f"o rel err {err:.1e}, state rel err {state_err:.1e}"


def check_lse_combine(device, backend):
    o_parts = torch.randn(4, 7, 16, 512, device=device)
    lse_parts = torch.randn(4, 7, 16, device=device)
    lse_parts[:, 0, 0] = float("-inf")
    lse_parts[2, 1] = float("-inf")
    with use_backend(backend):
        o, lse = ops.lse_combine(o_parts, lse_parts)
    with use_backend("reference"):
        o_ref, lse_ref = ops.lse_combine(o_parts, lse_parts)
    err = relative_error(o, o_ref)
    lse_ok = torch.allclose(lse, lse_ref, atol=1e-5, equal_nan=True) and bool(torch.isneginf(lse[0, 0]))
    return err < 1e-5 and lse_ok, f"o rel err {err:.1e}, lse ok {lse_ok}"


def check_dsa(device, backend, kv_fmt="bf16", index_fmt="fp8"):
    block_tokens, context = 64, 3000
    block_table, req_ids, positions, num_blocks = decode_batch(2, 3, context, block_tokens, device)
    index_pages = random_pages("index", index_fmt, num_blocks, block_tokens, device)
    kv_pages = random_pages("latent", kv_fmt, num_blocks, block_tokens, device)
    q_index = torch.randn(req_ids.shape[0], INDEX_HEADS, 128, device=device)
    w = torch.rand(req_ids.shape[0], INDEX_HEADS, device=device)
    q = torch.randn(req_ids.shape[0], 16, 576, device=device, dtype=torch.bfloat16)
    kw = dict(index_fmt=index_fmt, kv_fmt=kv_fmt, topk=512, max_context=context, softmax_scale=MLA_SCALE)
    args = (q_index, w, index_pages, q, kv_pages, block_table, req_ids, positions)
    with use_backend(backend):
        o, lse = ops.dsa_attention(*args, **kw)
    with use_backend("reference"):
        o_ref, lse_ref = ops.dsa_attention(*args, **kw)
    err = relative_error(o, o_ref)
    return err < 2e-2, f"o rel err {err:.1e}"


def check_cache_write(device, backend):
    results = []
    for kind, fmt in (("latent", "bf16"), ("latent", "fp8"), ("index", "fp8"), ("index", "bf16")):
        dim = 576 if kind == "latent" else 128
        values = torch.randn(50, dim, device=device) * 3
        slots = torch.randperm(8 * 16, device=device)[:50].to(torch.int32)
        slots[::7] = -1
        scale = torch.tensor(0.02, device=device) if (kind, fmt) == ("latent", "fp8") else None
        pages = random_pages(kind, fmt, 8, 16, device)
        a, b = pages.clone(), pages.clone()
        with use_backend(backend):
            ops.cache_write(values, slots, a, kind=kind, fmt=fmt, scale=scale)
        with use_backend("reference"):
            ops.cache_write(values, slots, b, kind=kind, fmt=fmt, scale=scale)
        results.append((f"{kind}:{fmt}", torch.equal(a, b)))
    ok = all(r for _, r in results)
    return ok, "bytes equal to reference: " + ", ".join(f"{n}={r}" for n, r in results)


# ---------------------------------------------------------------- full-size builds
def build_indexer(requests, per_request, context, index_fmt="fp8", q_dtype=torch.float8_e4m3fn, block_tokens=64):
    def build(device):
        block_table, req_ids, positions, num_blocks = decode_batch(requests, per_request, context, block_tokens,
                                                                   device)
        pages = random_pages("index", index_fmt, num_blocks, block_tokens, device)
        tokens = req_ids.shape[0]
        q = torch.randn(tokens, INDEX_HEADS, 128, device=device).to(q_dtype)
        w = torch.rand(tokens, INDEX_HEADS, device=device)
        kw = dict(index_fmt=index_fmt, max_context=context, check=False)
        key_bytes = requests * context * pages.shape[-1]
        return Built(
            run=lambda: ops.indexer_score(q, w, pages, block_table, req_ids, positions, **kw),
            baseline=lambda: baselines.indexer_score(q, w, pages, block_table, req_ids, positions, index_fmt,
                                                     context),
            bytes=key_bytes + tokens * context * 4,
            flops=2.0 * tokens * context * INDEX_HEADS * 128,
        )
    return build


def build_topk(tokens, width, k=TOPK):
    def build(device):
        scores = torch.randn(tokens, width, device=device)
        lengths = torch.full((tokens,), width, device=device, dtype=torch.int32)
        return Built(run=lambda: ops.topk(scores, lengths, k, check=False),
                     baseline=lambda: torch.topk(scores, k, dim=1), bytes=tokens * width * 4 + tokens * k * 4, flops=0)
    return build


def build_topk_of_indexer(requests, per_request, context, k=TOPK):
    """Top-k of real indexer scores (FP8 keys, FP8 queries): weighted relu sums crowd a few exponents,
    unlike Gaussian scores, which is what radix-select kernels are sensitive to."""
    def build(device):
        block_table, req_ids, positions, num_blocks = decode_batch(requests, per_request, context, 64, device)
        pages = random_pages("index", "fp8", num_blocks, 64, device)
        q = torch.randn(req_ids.shape[0], INDEX_HEADS, 128, device=device).to(torch.float8_e4m3fn)
        w = torch.rand(req_ids.shape[0], INDEX_HEADS, device=device)
        scores = ops.indexer_score(q, w, pages, block_table, req_ids, positions, index_fmt="fp8",
                                   max_context=context, check=False)
        del pages
        lengths = positions + 1
        return Built(run=lambda: ops.topk(scores, lengths, k, check=False),
                     baseline=lambda: torch.topk(scores, k, dim=1),
                     bytes=scores.numel() * 4 + scores.shape[0] * k * 4, flops=0)
    return build


def build_sparse_mla(tokens, heads, kv_fmt="bf16", k=TOPK, pool_tokens=1 << 20, block_tokens=64):
    def build(device):
        num_blocks = pool_tokens // block_tokens
        pages = random_pages("latent", kv_fmt, num_blocks, block_tokens, device)
        scale = torch.tensor(0.5, device=device) if kv_fmt == "fp8" else None
        q = torch.randn(tokens, heads, 576, device=device, dtype=torch.bfloat16)
        slots = random_slots(tokens, k, pool_tokens, device)
        kw = dict(kv_fmt=kv_fmt, kv_scale=scale, softmax_scale=MLA_SCALE, check=False)
        run = lambda: ops.sparse_mla(q, pages, slots, **kw)  # noqa: E731
        kept, notes = peers.agreeing(peers.flashmla_sparse_mla(q, pages, slots, kv_fmt, MLA_SCALE), run(), heads)
        return Built(
            run=run,
            baseline=lambda: baselines.sparse_mla(q, pages, slots, kv_fmt, scale, MLA_SCALE),
            bytes=tokens * k * pages.shape[-1] + q.numel() * 2 + tokens * heads * 512 * 2,
            flops=2.0 * tokens * heads * k * (576 + 512),
            peers=kept, peer_notes=notes,
        )
    return build


def build_lse_combine(parts, tokens, heads, dim=512):
    def build(device):
        o_parts = torch.randn(parts, tokens, heads, dim, device=device)
        lse_parts = torch.randn(parts, tokens, heads, device=device)
        return Built(run=lambda: ops.lse_combine(o_parts, lse_parts, check=False),
                     baseline=lambda: baselines.lse_combine(o_parts, lse_parts),
                     bytes=o_parts.numel() * 4 + tokens * heads * dim * 4, flops=0)
    return build


def _kda_inputs(batch, heads, device, dtype=torch.bfloat16):
    q, k = (torch.randn(batch, heads, 128, device=device, dtype=dtype) for _ in range(2))
    v = torch.randn(batch, heads, 128, device=device, dtype=dtype)
    g = -torch.rand(batch, heads, 128, device=device) * 0.1
    beta = torch.rand(batch, heads, device=device, dtype=dtype)
    return q, k, v, g, beta


def build_kda_decode(batch, heads=32):
    def build(device):
        pool = torch.randn(batch * 2, heads, 128, 128, device=device) * 0.05
        ids = torch.randperm(batch * 2, device=device)[:batch].to(torch.int32)
        q, k, v, g, beta = _kda_inputs(batch, heads, device)
        built = Built(
            run=lambda: ops.kda_decode(q, k, v, g, beta, pool, ids, check=False),
            baseline=lambda: baselines.kda_decode(q, k, v, g, beta, pool, ids, 128**-0.5, True),
            bytes=2.0 * batch * heads * 128 * 128 * 4, flops=0)
        peer = _fla_decode(q, k, v, g, beta, pool, ids)
        if peer is not None:
            built.peers["fla fused_recurrent_kda"] = peer
        return built
    return build


def _fla_decode(q, k, v, g, beta, pool, ids):
    """fla's decode step on the same pool, in place, indexed per request (vLLM's call)."""
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception:  # noqa: BLE001 - fla absent or broken: no peer column
        return None
    batch = q.shape[0]
    cu = torch.arange(batch + 1, device=q.device, dtype=torch.int64)
    return lambda: fused_recurrent_kda_fwd(
        q=q[None], k=k[None], v=v[None], g=g.to(q.dtype)[None], beta=beta[None], scale=128**-0.5,
        initial_state=pool, inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=ids.long(),
        use_qk_l2norm_in_kernel=True)


def build_kda_prefill(sequences, length, heads=32):
    def build(device):
        tokens = sequences * length
        q, k, v, g, beta = _kda_inputs(tokens, heads, device)
        cu = torch.arange(0, tokens + 1, length, device=device, dtype=torch.int32)
        pool = torch.randn(sequences, heads, 128, 128, device=device) * 0.05
        ids = torch.arange(sequences, device=device, dtype=torch.int32)
        built = Built(run=lambda: ops.kda_prefill(q, k, v, g, beta, cu, pool, ids, check=False),
                      bytes=tokens * heads * 128 * 2 * 5, flops=0, graph_ok=False)
        try:
            from fla.ops.kda import chunk_kda

            built.peers["fla chunk_kda"] = lambda: chunk_kda(
                q[None], k[None], v[None], g[None], beta[None], initial_state=pool.clone(), output_final_state=True,
                use_qk_l2norm_in_kernel=True, cu_seqlens=cu.long())
        except Exception:  # noqa: BLE001
            pass
        return built
    return build


def build_dsa(requests, per_request, context, heads, kv_fmt="fp8", index_fmt="fp8", block_tokens=64):
    def build(device):
        block_table, req_ids, positions, num_blocks = decode_batch(requests, per_request, context, block_tokens,
                                                                   device)
        index_pages = random_pages("index", index_fmt, num_blocks, block_tokens, device)
        kv_pages = random_pages("latent", kv_fmt, num_blocks, block_tokens, device)
        scale = torch.tensor(0.5, device=device) if kv_fmt == "fp8" else None
        tokens = req_ids.shape[0]
        q_index = torch.randn(tokens, INDEX_HEADS, 128, device=device).to(torch.float8_e4m3fn)
        w = torch.rand(tokens, INDEX_HEADS, device=device)
        q = torch.randn(tokens, heads, 576, device=device, dtype=torch.bfloat16)
        kw = dict(index_fmt=index_fmt, kv_fmt=kv_fmt, kv_scale=scale, topk=TOPK, max_context=context,
                  softmax_scale=MLA_SCALE, check=False)
        args = (q_index, w, index_pages, q, kv_pages, block_table, req_ids, positions)
        run = lambda: ops.dsa_attention(*args, **kw)  # noqa: E731
        composite, notes = _dsa_peer(args, kv_fmt, context, heads, run)
        return Built(
            run=run,
            # by keyword: the positional order once disagreed with the signature (caught by bench --quick)
            baseline=lambda: baselines.dsa_attention(
                q_index=q_index, index_weights=w, index_pages=index_pages, index_fmt=index_fmt, q=q,
                kv_pages=kv_pages, kv_fmt=kv_fmt, kv_scale=scale, block_table=block_table, req_ids=req_ids,
                positions=positions, topk_k=TOPK, max_context=context, softmax_scale=MLA_SCALE),
            bytes=requests * context * index_pages.shape[-1] + tokens * TOPK * kv_pages.shape[-1],
            flops=2.0 * tokens * context * INDEX_HEADS * 128 + 2.0 * tokens * heads * TOPK * 1088,
            peers=composite, peer_notes=notes)
    return build


def _dsa_peer(args, kv_fmt, context, heads, run) -> tuple[dict, list[str]]:
    """The DSA layer a user assembles from peers: our indexer (DeepGEMM's does not run on this torch),
    ``torch.topk`` of its scores, slots by plain torch indexing, FlashMLA's sparse decode."""
    q_index, w, index_pages, q, kv_pages, block_table, req_ids, positions = args
    decode = peers.flashmla_decode(q, kv_pages, MLA_SCALE) if kv_fmt == "fp8_ds_mla" else None
    if decode is None or index_pages.shape[-1] != 132:
        return {}, []
    block = kv_pages.shape[1]

    def composite():
        scores = ops.indexer_score(q_index, w, index_pages, block_table, req_ids, positions, index_fmt="fp8",
                                   max_context=context, check=False)
        values, picked = torch.topk(scores, TOPK, dim=1)
        picked = torch.where(torch.isfinite(values), picked, -1)
        page = block_table[req_ids.long()[:, None], torch.div(picked.clamp_min(0), block, rounding_mode="floor")]
        return decode(torch.where(picked >= 0, page * block + picked % block, -1).to(torch.int32))

    return peers.agreeing({"indexer + torch.topk + FlashMLA": composite}, run(), heads)


def all_cases(quick: bool = False) -> list[Case]:
    """docs/performance.md's shapes (``quick``: the same ops at a fraction of the size, for a smoke run)."""
    ctx128 = 16384 if quick else 131072
    ctx32 = 8192 if quick else 32768
    ctx1m = 65536 if quick else 1 << 20
    dev_check = lambda fn, **kw: (lambda device, backend: fn(device, backend, **kw))  # noqa: E731
    cases = [
        Case("indexer fp8 q / fp8 keys", "indexer_score", f"64x5 tok, ctx {ctx128}", build_indexer(64, 5, ctx128),
             dev_check(check_indexer)),
        Case("indexer bf16 q / fp8 keys", "indexer_score", f"64x5 tok, ctx {ctx128}",
             build_indexer(64, 5, ctx128, q_dtype=torch.bfloat16),
             dev_check(check_indexer, q_dtype=torch.bfloat16)),
        Case("indexer fp8 q / fp8 keys", "indexer_score", f"64x5 tok, ctx {ctx32}", build_indexer(64, 5, ctx32),
             dev_check(check_indexer)),
        # one token a request (the common decode step), bf16 queries and MXFP4 (68 B) keys beside FP8 ones
        Case("indexer bf16 q / fp8 keys", "indexer_score", f"64x1 tok, ctx {ctx128}",
             build_indexer(64, 1, ctx128, q_dtype=torch.bfloat16), dev_check(check_indexer, q_dtype=torch.bfloat16)),
        Case("indexer fp8 q / mxfp4 keys", "indexer_score", f"64x1 tok, ctx {ctx128}",
             build_indexer(64, 1, ctx128, index_fmt="mxfp4"), dev_check(check_indexer, index_fmt="mxfp4")),
        Case("indexer bf16 q / mxfp4 keys", "indexer_score", f"64x1 tok, ctx {ctx128}",
             build_indexer(64, 1, ctx128, index_fmt="mxfp4", q_dtype=torch.bfloat16),
             dev_check(check_indexer, index_fmt="mxfp4", q_dtype=torch.bfloat16)),
        Case("indexer fp8 q / fp8 keys", "indexer_score", f"8x1 tok, ctx {ctx1m}", build_indexer(8, 1, ctx1m),
             dev_check(check_indexer)),
        Case("indexer bf16 q / bf16 keys", "indexer_score", f"64x5 tok, ctx {ctx32}",
             build_indexer(64, 5, ctx32, index_fmt="bf16", q_dtype=torch.bfloat16),
             dev_check(check_indexer, index_fmt="bf16", q_dtype=torch.bfloat16)),
        Case("topk k=2048", "topk", f"[320, {ctx128}]", build_topk(320, ctx128), dev_check(check_topk)),
        Case("topk k=2048, indexer scores", "topk", f"[320, {ctx128}] (64x5 at {ctx128})",
             build_topk_of_indexer(64, 5, ctx128), dev_check(check_topk)),
        Case("sparse MLA bf16", "sparse_mla", "320 tok, H=128", build_sparse_mla(320, 128), dev_check(check_sparse_mla)),
        Case("sparse MLA fp8", "sparse_mla", "320 tok, H=128", build_sparse_mla(320, 128, "fp8"),
             dev_check(check_sparse_mla, kv_fmt="fp8")),
        Case("sparse MLA bf16", "sparse_mla", "320 tok, H=16", build_sparse_mla(320, 16),
             dev_check(check_sparse_mla, heads=16)),
        Case("sparse MLA fp8", "sparse_mla", "320 tok, H=16", build_sparse_mla(320, 16, "fp8"),
             dev_check(check_sparse_mla, heads=16, kv_fmt="fp8")),
        Case("sparse MLA bf16", "sparse_mla", "8 tok, H=128", build_sparse_mla(8, 128), dev_check(check_sparse_mla)),
        Case("sparse MLA bf16 (prefill)", "sparse_mla", f"{512 if quick else 4096} tok, H=128",
             build_sparse_mla(512 if quick else 4096, 128), dev_check(check_sparse_mla)),
        # fp8_ds_mla (FlashMLA's V32 bytes): the FlashMLA peer column, H = 128, 64, 16 and 12 (the TP slices), 5, 1 and
        # 8 query tokens per request of 64 requests
        *(Case("sparse MLA fp8_ds_mla", "sparse_mla", f"{64 * per} tok (64x{per}), H={heads}",
               build_sparse_mla(64 * per, heads, "fp8_ds_mla"),
               dev_check(check_sparse_mla, heads=heads, kv_fmt="fp8_ds_mla"))
          for per in (5, 1, 8) for heads in (128, 64, 16, 12)),
        # NVFP4 latents at the TP slices' head counts (FlashMLA reads no NVFP4: no peer column;
        # scripts/h200/wgmma_fp4_check.py times FlashMLA on fp8_ds_mla bytes of the same tokens beside it)
        *(Case("sparse MLA nvfp4", "sparse_mla", f"{64 * per} tok (64x{per}), H={heads}",
               build_sparse_mla(64 * per, heads, "nvfp4"), dev_check(check_sparse_mla, heads=heads, kv_fmt="nvfp4"))
          for per in (5, 1) for heads in (16, 12)),
        Case("lse combine W=8", "lse_combine", "320 tok, H=128", build_lse_combine(8, 320, 128),
             dev_check(check_lse_combine)),
        Case("KDA decode", "kda_decode", "B=64, H=32", build_kda_decode(64), dev_check(check_kda_decode)),
        Case("KDA decode", "kda_decode", "B=256, H=32", build_kda_decode(256), dev_check(check_kda_decode)),
        Case("KDA prefill", "kda_prefill", "8x4096 tok, H=32", build_kda_prefill(8, 512 if quick else 4096),
             dev_check(check_kda_prefill, timed_route=True)),
        Case("DSA layer decode", "dsa_attention", f"64x5 tok, ctx {ctx128}, H=128",
             build_dsa(64, 5, ctx128, 128, kv_fmt="fp8_ds_mla"), dev_check(check_dsa, kv_fmt="fp8_ds_mla")),
        Case("DSA layer decode", "dsa_attention", f"64x5 tok, ctx {ctx128}, H=16",
             build_dsa(64, 5, ctx128, 16, kv_fmt="fp8_ds_mla"), dev_check(check_dsa, kv_fmt="fp8_ds_mla")),
        Case("cache write", "cache_write", "checks only", None, dev_check(check_cache_write)),
        model_decode_case(quick),
    ]
    return cases


def model_decode_case(quick: bool = False) -> Case:
    """One decode step of ``k31-pro-slice``: 64 requests of context 4096 (quick: 16 of 1024), eager and
    replayed from a CUDA graph (:mod:`.model_step`)."""
    from .model_step import build_model_decode, check_model_decode

    requests, context = (16, 1024) if quick else (64, 4096)
    return Case("model decode step", "model", f"k31-pro-slice, {requests} req x ctx {context}",
                build_model_decode("k31-pro-slice", requests, context),
                lambda device, backend: check_model_decode(device, backend))


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or a <= 0 or math.isnan(a) or math.isnan(b):
        return None
    return b / a
