"""The wgmma few-heads sparse MLA kernel (``sparse_mla_wgmma``) on one H200: checked against the float64 reference on
edge cases first, then timed beside FlashMLA (heads padded to 64) and the Gluon few-heads kernel, same run, same bytes.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/wgmma_mla_check.py [--pool-tokens 1048576] [--no-sweep]

1. Edge cases (one line each): 1, 12 and 16 heads, skipped (-1) and out-of-range slots, a row with no valid slot, splits
   with a partial last one, per-record magnitudes 2^-6..2^6 (scales spread over 12 binades), a strided pool (blocks not
   back to back), 16-slot blocks, bf16 queries scaled by 1e-20 and 1e20, records whose codes are all e4m3's largest
   (where the FP8 logits' accumulation was at its worst), 2 and 3 stages, rows whose first 200 / 600 slots are skipped
   and whose later records are 4x larger (the kept maxima move late); each with fixed splits and on the balanced
   schedule (``programs`` 7 and 264: pieces across rows, one step each). The lse error is relative to the largest of
   |lse|, the row's largest sum |q k| and 1 (an FP8-accumulated logit's error grew with its products' magnitudes, not
   with their cancelling sum: the kernel's logits were FP8 MMAs until the thirty-seventh session).
2. The serving shape: 64 requests x 5 tokens (and x 1, x 8; 66 x 4, two full waves of two programs a SM) x top-k 2048
   over a 1M-token fp8_ds_mla pool (656 MB, larger than the L2), H = 16 and 12; each variant (the balanced schedule's,
   two programs a SM, also every row against the fixed splits; and earlier commits' kernels where modules named
   :data:`BASELINE_PREFIX`... are present: the thirty-sixth session timed bc0171a's beside its own) checked on its
   first rows against the reference, then timed (``do_bench`` median); a table of ms, TB/s of gathered bytes, % of
   the copy ceiling, FlashMLA / ours.

Exits with one ``error:`` line when a check fails (after timing what passed).
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
from mla_check import edge_errors  # scripts/h200/mla_check.py
from script_cli import edge_then_sweep, run  # scripts/h200/script_cli.py

TOPK, BLOCK_TOKENS, SOFTMAX_SCALE = 2048, 64, 192**-0.5
# lse: of max(|lse|, the row's largest sum |q k|, 1). The fp16 logits (thirty-seventh session, H100 R4) measured o <=
# 1.7e-3 and lse <= 6.3e-8 of that scale on the edge cases; the FP8 logits before needed 1e-2 / 1e-3
TOL_O, TOL_LSE = 4e-3, 1e-5
CHECK_ROWS = 8
# fixed splits, and the balanced schedule (thirty-eighth session) with 7 programs (pieces crossing rows, several parts a
# row) and 264 (more programs than steps: one step each)
EDGE_LAUNCHES = (dict(), dict(programs=7), dict(programs=264))
# (H100, thirty-eighth session: 3 stages and 768 / 512-slot splits beside the default, the wave tail's share probed by
# the 264-token case: 528 programs, two full waves of two a SM on 132 SMs, against 320 tokens' 640)
VARIANTS = {"full": (dict(split_size=1024), dict(split_size=1024, stages=3), dict(split_size=768),
                     dict(split_size=512)), "small": (dict(split_size=512),)}
# frozen copies of earlier commits' kernel module, timed beside the current one when present: a device call copies
# them into the package (`cp .baseline/_baseline_wgmma*.py backends/triton_kernels/`, .baseline carried; not in the
# repo); every module of the package named _baseline_wgmma* is timed, in name order
BASELINE_PREFIX = "_baseline_wgmma"
GLUON_BEST = dict(block_n=16, stages=3, q_smem=True, maxnreg=168, split_size=512)  # sixteenth session's best


def edge_cases(torch, failures):
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    gen = torch.Generator().manual_seed(0)
    spec = latent_format("fp8_ds_mla")
    for heads, block_tokens, width, split, stages, strided, q_mag, lead_skip in (
            (16, 64, 2048, 512, 2, False, 2.0, 0), (12, 64, 300, 128, 2, False, 2.0, 0),
            (1, 16, 77, None, 3, True, 2.0, 0), (16, 16, 1000, 512, 2, True, 2.0, 0),
            (16, 64, 37, 16, 2, False, 2.0, 0),
            (16, 64, 2048, None, 3, False, 1e-20, 0), (12, 64, 700, 256, 2, True, 1e20, 0),
            (5, 64, 130, 64, 3, False, 2.0, 0), (16, 64, 512, None, 2, False, -2.0, 0),
            (16, 64, 1000, 512, 2, False, 2.0, 200), (16, 64, 1000, None, 2, False, 2.0, 600)):
        blocks = 40
        slots_n = blocks * block_tokens
        rows = torch.randn(slots_n, 576, generator=gen) * torch.exp2(torch.randint(-6, 7, (slots_n, 1), generator=gen))
        if q_mag < 0:  # every dim of a record the same value (1 .. 13): every code the largest, e4m3's 448
            rows = (torch.arange(slots_n) % 13 + 1.0)[:, None].repeat(1, 576)
            q_mag = -q_mag
        records = spec.pack(rows + 1e-3).view(blocks, block_tokens, 656)
        if strided:  # blocks 16 bytes further apart than their records (a view into a larger buffer)
            buf = torch.zeros(blocks, block_tokens * 656 + 16, dtype=torch.uint8, device="cuda")
            pages_gpu = buf[:, : block_tokens * 656].unflatten(1, (block_tokens, 656))
            pages_gpu.copy_(records.cuda())
        else:
            pages_gpu = records.cuda()
        tokens = 6
        slots = torch.randint(-1, slots_n, (tokens, width), generator=gen, dtype=torch.int32)
        slots[1, :3] = slots_n + 5  # past the pool: skipped
        slots[:, :lead_skip] = -1  # a row's first steps (and, past a split's size, splits) with no valid slot
        if lead_skip:  # the later slots' records 4x larger: the kept maxima move late
            rows_grown = spec.unpack(records.view(-1, 656)).float()
            late = slots[:, lead_skip + 100:].clamp(min=0).long().unique()
            rows_grown[late] *= 4.0
            records = spec.pack(rows_grown).view(blocks, block_tokens, 656)
            pages_gpu.copy_(records.cuda())
        slots[-1] = -1  # a row with no valid slot
        q = (torch.randn(tokens, heads, 576, generator=gen) * q_mag).to(torch.bfloat16)
        safe = torch.where(slots >= slots_n, -1, slots)
        want_o, want_lse = reference(q.float(), records, safe, "fp8_ds_mla", None, 0.07)
        # a logit's error from FP8 MMAs grows with sum |q k| (its products' magnitudes), not with the sum itself
        kv = spec.unpack(records.view(-1, 656)).double()[safe.clamp(min=0).long()]
        magnitude = (torch.einsum("thd,tkd->thk", q.double().abs(), kv.abs()) * 0.07 * (safe >= 0)[:, None, :]).amax(-1)
        for launch in EDGE_LAUNCHES:
            o, lse = sparse_mla_wgmma(q.cuda(), pages_gpu, slots.cuda(), "fp8_ds_mla", None, 0.07, stages=stages,
                                      split_size=split, **launch)
            torch.cuda.synchronize()
            # (lse relative past 1: queries of 1e20 give logits near 1e22, whose fp32 lse is that close; judged
            # past the row's largest sum |q k| too, which an FP8-accumulated logit's error grows with)
            err = edge_errors(torch, o, lse, want_o, want_lse)
            lse_err_mag = edge_errors(torch, o, lse, want_o, want_lse, lse_floor=magnitude).lse
            o_err, lse_err, empty = err.o, err.lse, err.empty
            ok = o_err < TOL_O and lse_err_mag < TOL_LSE and empty and err.finite
            case = (f"H={heads} blocks of {block_tokens} width {width} split {split} stages {stages} |q|~{q_mag:g}"
                    + (" strided" if strided else "") + (f" first {lead_skip} skipped" if lead_skip else "")
                    + "".join(f" {k} {v}" for k, v in launch.items()))
            print(f"  {case:<80s} o rel err {o_err:.2e}  lse err {lse_err:.2e} (of sum|qk| {lse_err_mag:.2e})  "
                  f"empty row ok {empty}  {'pass' if ok else 'FAIL'}", flush=True)
            if not ok:
                failures.append(case)


def check(torch, fn, q, pages, slots, fmt="fp8_ds_mla", kv_scale=None):
    """``fn()``'s first rows against the float64 reference on ``pages`` (``fmt`` records; per-tensor FP8: their
    ``kv_scale``) -> (ok, message)."""
    from dsahal.reference.sparse_mla import sparse_mla as reference

    o, lse = fn()
    torch.cuda.synchronize()
    rows = min(CHECK_ROWS, q.shape[0])
    want_o, want_lse = reference(q[:rows], pages, slots[:rows], fmt, kv_scale, SOFTMAX_SCALE)
    o_err = float((o[:rows].double() - want_o.double()).norm() / want_o.double().norm())
    finite = torch.isfinite(want_lse)
    lse_err = float((lse[:rows].float()[finite] - want_lse.float()[finite]).abs().max())
    return o_err < 2e-2 and lse_err < 2e-2, f"o rel err {o_err:.2e}, lse max err {lse_err:.2e}"


def rows_agree(torch, case, fn, fixed_fn, failures) -> None:
    """Whether ``fn()`` (the balanced schedule) gives the fixed splits' outputs on every row, to their rounding (the two
    sum a row's slots in other groups): one line, and a failure when they differ."""
    (o, lse), (want_o, want_lse) = fn(), fixed_fn()
    torch.cuda.synchronize()
    row_err = ((o.float() - want_o.float()).norm(dim=-1) / want_o.float().norm(dim=-1).clamp(min=1e-30)).max().item()
    finite = torch.isfinite(want_lse)
    same_inf = bool((torch.isfinite(lse) == finite).all())
    lse_err = (lse[finite] - want_lse[finite]).abs().max().item() if finite.any() else 0.0
    ok = row_err < 1e-2 and lse_err < 1e-4 and same_inf
    verdict = (f"{'agree' if ok else 'DIFFER'}: worst row's o rel err {row_err:.2e}, lse max err {lse_err:.2e}, "
               f"-inf rows the same {same_inf}")
    print(f"  all rows {case}: {verdict}", flush=True)
    if not ok:
        failures.append(f"{case}: {verdict}")


def serving_inputs(torch, pool_slots, heads, tokens):
    """A serving shape's inputs, seeded by (heads, tokens): slots ``[tokens, TOPK]`` int32 into a pool of
    ``pool_slots`` (the last 7 of each row skipped) and bf16 queries ``[tokens, heads, 576]``."""
    gen = torch.Generator(device="cuda").manual_seed(heads * 1000 + tokens)
    slots = torch.randint(0, pool_slots, (tokens, TOPK), device="cuda", dtype=torch.int32, generator=gen)
    slots[:, -7:] = -1
    return slots, torch.randn(tokens, heads, 576, device="cuda", generator=gen).to(torch.bfloat16)


def flash_mla(torch, q, pages, slots, requests, per_request):
    """FlashMLA's SM90 sparse decode on the same bytes, heads zero-padded to 64 outside the timed call: (timed,
    unpadded) or None."""
    try:
        import flash_mla as fm
    except Exception as exc:  # noqa: BLE001 - no peer column, said once
        print(f"FlashMLA not available: {type(exc).__name__}: {exc}")
        return None
    tokens, heads, _ = q.shape
    qp = torch.zeros(tokens, 64, 576, dtype=q.dtype, device="cuda")
    qp[:, :heads] = q
    q4 = qp.view(requests, per_request, 64, 576)
    cache = pages.view(pages.shape[0], BLOCK_TOKENS, 1, 656)
    idx = slots.view(requests, per_request, slots.shape[1])
    meta, _ = fm.get_mla_metadata()

    def timed():
        return fm.flash_mla_with_kvcache(q4, cache, None, None, 512, meta, softmax_scale=SOFTMAX_SCALE,
                                         is_fp8_kvcache=True, indices=idx, use_legacy=True, kv_format="V32")

    def unpadded():
        out, lse = timed()
        return out.reshape(tokens, 64, 512)[:, :heads], lse.transpose(1, 2).reshape(tokens, 64)[:, :heads]

    return timed, unpadded


def sweep(torch, pool_tokens, ceiling, failures, with_gluon=False):
    import importlib

    from dsahal.backends.triton_kernels.sparse_mla_gluon import sparse_mla_gluon
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma

    import pkgutil

    from dsahal.backends import triton_kernels

    names = sorted(m.name for m in pkgutil.iter_modules(triton_kernels.__path__) if m.name.startswith(BASELINE_PREFIX))
    baselines = [(name, importlib.import_module(f"{triton_kernels.__name__}.{name}")) for name in names]
    for name, _ in baselines:
        print(f"baseline kernel module present: {name}")

    pages = cache_pools.latent_pools(torch, ("fp8_ds_mla",), pool_tokens, "cuda")["fp8_ds_mla"][0]
    rows = []
    for heads, requests, per_request, kind in ((16, 64, 5, "full"), (12, 64, 5, "full"), (16, 64, 1, "small"),
                                               (16, 64, 8, "full"), (16, 8, 1, "small"), (16, 66, 4, "full")):
        tokens = requests * per_request
        slots, q = serving_inputs(torch, pages.shape[0] * BLOCK_TOKENS, heads, tokens)
        case = f"H={heads} {requests}x{per_request}"
        runs = []
        peer = flash_mla(torch, q, pages, slots, requests, per_request)
        if peer is not None:
            runs.append(("FlashMLA (h pad 64)", peer[0], peer[1]))
        if with_gluon:
            runs.append(("gluon few heads (best)", *(2 * (lambda: sparse_mla_gluon(
                q, pages, slots, "fp8_ds_mla", None, SOFTMAX_SCALE, **GLUON_BEST),))))
        for module_name, baseline in baselines:
            cfg = VARIANTS[kind][0]
            fn = (lambda cfg=cfg, b=baseline: b.sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, SOFTMAX_SCALE,
                                                                  **cfg))
            runs.append((f"{module_name[1:]} {cfg}", fn, fn))
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for cfg in VARIANTS[kind] + (dict(programs=2 * sms),):  # (the balanced schedule: two programs a SM)
            fn = (lambda cfg=cfg: sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, SOFTMAX_SCALE, **cfg))
            runs.append((f"wgmma {cfg}", fn, fn))
            if "programs" in cfg:  # every row against the fixed splits' (the reference checks the first rows only)
                rows_agree(torch, f"{case} {cfg}", fn, lambda: sparse_mla_wgmma(
                    q, pages, slots, "fp8_ds_mla", None, SOFTMAX_SCALE, **VARIANTS[kind][0]), failures)
        peer_ms = None
        for name, timed, checked in runs:
            try:
                ok, msg = check(torch, checked, q, pages, slots)
            except Exception as exc:  # noqa: BLE001 - recorded, the rest goes on
                ok, msg = False, f"{type(exc).__name__}: {str(exc)[:300]}"
            print(f"  check {case:<12s} {name:<48s} {'pass' if ok else 'FAIL'}  {msg}", flush=True)
            if not ok:
                failures.append(f"{case} {name}: {msg}")
                continue
            ms = timing.bench_ms(timed, "cuda")
            peer_ms = ms if name.startswith("FlashMLA") else peer_ms
            tbps = tokens * TOPK * 656 / (ms * 1e-3) / 1e12
            rows.append((case, name, ms, tbps, 100 * tbps / ceiling, None if peer_ms is None else peer_ms / ms))
    print("\n| case | variant | ms | TB/s gathered | % copy | FlashMLA / ours |")
    print("|---|---|---:|---:|---:|---:|")
    for case, name, ms, tbps, pct, ratio in rows:
        print(f"| {case} | {name} | {ms:.4f} | {tbps:.2f} | {pct:.1f} | {'-' if ratio is None else f'{ratio:.2f}'} |")


def profile(torch, pool_tokens):
    """the default launch at H = 16, 64 x 5, four times (for Nsight Compute)"""
    from dsahal.backends.nvidia.config import WGMMA_FEW_HEADS
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma

    pages = cache_pools.latent_pools(torch, ("fp8_ds_mla",), pool_tokens, "cuda")["fp8_ds_mla"][0]
    slots = torch.randint(0, pages.shape[0] * BLOCK_TOKENS, (320, TOPK), device="cuda", dtype=torch.int32)
    q = torch.randn(320, 16, 576, device="cuda").to(torch.bfloat16)
    for _ in range(4):
        sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, SOFTMAX_SCALE, **WGMMA_FEW_HEADS)
    torch.cuda.synchronize()


def main(argv=None) -> int:
    return edge_then_sweep("wgmma_mla_check", __doc__, edge_cases, sweep, argv, profile=profile)


if __name__ == "__main__":
    run("wgmma_mla_check", main)
