"""The Gluon indexer (``indexer_gluon``) on edge cases beyond a sweep's timed shapes, against the float64 reference:
shared by ``indexer_alu_sweep.py`` (FP8 keys) and ``mxfp4_indexer_sweep.py`` (MXFP4 keys).

A case: a paged pool of random keys (``pools.index_pool``), a decode batch over it with one unmapped block and a
shorter causal bound mid-tile, random queries (bf16 rows 1 and 2 scaled by 1e-20 and 1e20: the split's per-row power of
two) and head weights; the kernel's scores judged against the reference's, one printed line each.
"""
from __future__ import annotations

import pools as cache_pools  # scripts/h200/pools.py


def paged_case(torch, fmt, heads, block_tokens, requests, per_request, context, q_dtype, gen, device, edit_pages=None):
    """(q, w, pages, table, req, pos, out) for one case; ``edit_pages(pages)`` may change the pool's bytes first."""
    blocks = requests * -(-context // block_tokens) + 4
    pages = cache_pools.index_pool(torch, fmt, blocks, gen, device, block_tokens)
    if edit_pages is not None:
        edit_pages(pages)
    table, req, pos = cache_pools.decode_batch(torch, requests, per_request, context, blocks, gen, device, block_tokens)
    table[-1, 1] = -1  # an unmapped block
    pos[0] = context // 3 + 1  # a shorter causal bound, mid-tile
    tokens = requests * per_request
    q = torch.randn(tokens, heads, 128, device=device, generator=gen)
    if q_dtype == torch.bfloat16 and tokens >= 3:  # rows far from 1: the split's per-row power of two
        q[1] *= 1e-20
        q[2] *= 1e20
    q = q.to(q_dtype)
    w = torch.randn(tokens, heads, device=device, generator=gen)
    out = torch.full((tokens, context), float("nan"), device=device)
    return q, w, pages, table, req, pos, out


def launch_as_backend(q, w, pages, table, req, pos, context, out, index_fmt="fp8", segment=5, **launch):
    """The Gluon kernel on a call with segments of its tokens a request (at most ``segment``, 5 as the backend's
    route: a request's 5 tokens with ``segment`` 2 are three segments, 2 + 2 + 1, each reading the key tiles)."""
    from dsahal.backends.triton_kernels import indexer_gluon
    from dsahal.backends.triton_kernels.indexer import _request_group
    from dsahal.backends.triton_kernels.segments import segment_plan

    group = _request_group(segment, q.shape[0], table.shape[0], True)
    offsets, starts = segment_plan(req, group)
    return indexer_gluon.launch(q, w, pages, table, req, pos, offsets, context, out, starts=starts, group=group,
                                index_fmt=index_fmt, **launch)


def check_gluon(torch, name, args, context, out, group, judge, failures, index_fmt="fp8", **launch):
    """Run the Gluon kernel on ``args`` (q, w, pages, table, req, pos) and ``judge(got, want)`` -> (ok, status) its
    scores against the float64 reference's; printed, and listed in ``failures`` unless ok."""
    from dsahal.backends.triton_kernels import indexer_gluon
    from dsahal.backends.triton_kernels.segments import segment_plan
    from dsahal.reference.indexer import indexer_score as reference

    q, w, pages, table, req, pos = args
    try:
        offsets, starts = segment_plan(req, group)
        got = indexer_gluon.launch(q, w, pages, table, req, pos, offsets, context, out, starts=starts, group=group,
                                   index_fmt=index_fmt, **launch).cpu()
        want = reference(q.float().cpu(), w.cpu(), pages.cpu(), table.cpu(), req.cpu(), pos.cpu(), index_fmt, context)
        ok, status = judge(got, want)
        status = f"{status}  {'ok' if ok else 'FAIL'}"
    except Exception as exc:  # noqa: BLE001 - listed as a failure
        ok, status = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    print(f"  check {name:<72s} {status}", flush=True)
    if not ok:
        failures.append(f"{name}: {status}")
