"""FlashMLA on what the serving path hands it: page views of the packed pool, and batch invariance.

Usage (on the H200, from the repository with dsahal importable)::

    python scripts/h200/flashmla_views.py

1. Sparse decode (fp8_ds_mla) on layer pages that are strided views of a real ``PackedKVCache`` (each
   block's page is a slice of a pool row that also holds the other layers' pages): the route's kernel call
   (``flashmla.sparse_mla_decode``, called directly, past the verifier that declines such views today)
   against the float64 reference on the same bytes, and every pool byte outside the page view unchanged.
2. Sparse prefill (bf16, contiguous) rows computed in batches of 1, 7, 64 and 320 tokens: bitwise equal to
   the same rows computed in the 320-token batch (the batch-invariant mode keeps this route).
3. Sparse decode rows across batch sizes: reported (expected to differ: split-KV by the batch).

Prints one line per check and exits 1 with an ``error:`` line when check 1 or 2 fails.
"""
from __future__ import annotations

import sys

import torch

import dsahal
from dsahal import ops
from dsahal.backends.nvidia import flashmla
from dsahal.conformance.paged import packed_cache, store
from dsahal.formats import cache_format

SCALE = 192 ** -0.5
BLOCK = 64


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def packed_decode_check(gen, heads: int, tokens: int, topk: int, blocks: int) -> tuple[bool, str]:
    cache, pages_of = packed_cache("fp8_ds_mla", "fp8", blocks, BLOCK, gen)
    guarded = pages_of("latent")
    spec = cache_format("latent", "fp8_ds_mla")
    num_slots = blocks * BLOCK
    written = torch.randperm(num_slots, generator=gen)[: num_slots // 2]
    store(spec, guarded.pages, written, torch.randn(written.numel(), spec.dim, generator=gen), None)  # on the CPU
    pool = cache.pool.cuda()  # the whole pool on the GPU, and the same page view of it
    pages = pool.as_strided(guarded.pages.shape, guarded.pages.stride(),
                            guarded.pages.storage_offset() - cache.pool.storage_offset())
    written = written.cuda()
    before = pool.clone()
    slots = written[torch.randint(0, written.numel(), (tokens, topk), generator=gen)].to(torch.int32)
    slots[:, ::7] = -1
    q = torch.randn(tokens, heads, 576, generator=gen).cuda().to(torch.bfloat16)
    with dsahal.use_backend("reference"):
        o_ref, lse_ref = ops.sparse_mla(q.float(), pages, slots, kv_fmt="fp8_ds_mla", kv_scale=None,
                                        softmax_scale=SCALE)
    o, lse = flashmla.sparse_mla_decode(q, pages, slots, "fp8_ds_mla", None, SCALE)
    torch.cuda.synchronize()
    problems = []
    err = rel(o, o_ref)
    if not err < 2e-2:
        problems.append(f"o rel err {err:.2e}")
    lse_err = float((lse - lse_ref).abs().max())
    if not lse_err < 2e-2:
        problems.append(f"lse max diff {lse_err:.2e}")
    changed = int((pool != before).sum())
    if changed:
        problems.append(f"{changed} pool bytes changed")
    desc = f"H={heads} T={tokens} k={topk} strides {tuple(pages.stride())}"
    return not problems, f"{desc}: " + (", ".join(problems) or f"o rel err {err:.1e}, lse diff {lse_err:.1e}")


def prefill_invariance(gen, heads: int = 128, tokens: int = 320, topk: int = 2048) -> tuple[bool, str]:
    kv_tokens = 1 << 16
    pages = torch.randn(kv_tokens // BLOCK, BLOCK, 576, generator=gen).to(torch.bfloat16).view(torch.uint8).cuda()
    slots = torch.randint(0, kv_tokens, (tokens, topk), generator=gen, dtype=torch.int32).cuda()
    q = torch.randn(tokens, heads, 576, generator=gen).to(torch.bfloat16).cuda()
    o_all, lse_all = flashmla.sparse_mla_prefill(q, pages, slots, "bf16", None, SCALE)
    bad = []
    for size in (1, 7, 64, 319):
        o, lse = flashmla.sparse_mla_prefill(q[-size:], pages, slots[-size:], "bf16", None, SCALE)
        if not (torch.equal(o, o_all[-size:]) and torch.equal(lse, lse_all[-size:])):
            bad.append(size)
    return not bad, f"prefill H={heads}: rows of batches 1/7/64/319 vs 320 " + ("bitwise equal" if not bad else
                                                                                  f"differ at sizes {bad}")


def decode_batch_dependence(gen, heads: int = 128, tokens: int = 320, topk: int = 2048) -> str:
    kv_tokens = 1 << 16
    spec = cache_format("latent", "fp8_ds_mla")
    pages = torch.zeros(kv_tokens // BLOCK, BLOCK, spec.token_bytes, dtype=torch.uint8).cuda()
    store(spec, pages, torch.arange(kv_tokens).cuda(), torch.randn(kv_tokens, spec.dim, generator=gen).cuda(), None)
    slots = torch.randint(0, kv_tokens, (tokens, topk), generator=gen, dtype=torch.int32).cuda()
    q = torch.randn(tokens, heads, 576, generator=gen).to(torch.bfloat16).cuda()
    o_all, _ = flashmla.sparse_mla_decode(q, pages, slots, "fp8_ds_mla", None, SCALE)
    o_one, _ = flashmla.sparse_mla_decode(q[-8:], pages, slots[-8:], "fp8_ds_mla", None, SCALE)
    return f"decode H={heads}: last 8 rows alone vs in 320 " + ("bitwise equal" if torch.equal(o_one, o_all[-8:])
                                                               else "differ (split-KV by the batch)")


def main() -> int:
    ok, why = flashmla.probe()
    print(f"flashmla probe: {ok} ({why})")
    if not ok:
        print(f"error: FlashMLA does not load here: {why}")
        return 1
    gen = torch.Generator().manual_seed(7)
    failures = []
    for heads, tokens, topk, blocks in ((128, 40, 2048, 96), (64, 17, 512, 40), (16, 9, 128, 8)):
        good, line = packed_decode_check(gen, heads, tokens, topk, blocks)
        print(("pass " if good else "FAIL ") + "packed-pool decode " + line)
        failures += [] if good else [line]
    good, line = prefill_invariance(gen)
    print(("pass " if good else "FAIL ") + line)
    failures += [] if good else [line]
    print("info " + decode_batch_dependence(gen))
    if failures:
        print(f"error: {len(failures)} FlashMLA check(s) failed: {failures[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
