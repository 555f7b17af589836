"""Batch-invariant mode's general sparse-MLA kernel (the route at 64+ heads where FlashMLA is not installed).

Usage (on the H200, from the repository with dsahal importable)::

    python scripts/h200/invariant_mla_check.py [--cpu-smoke]

The thirtieth session measured the DSA layer without FlashMLA at 7.59 ms in batch-invariant mode against 2.09 in
default mode (H = 128): that mode's compile of the kernel knew nothing of the fp8_ds_mla cache. Since the
thirty-first session it keeps the cache's facts and those of the tensors the launcher aligns, and on sm_90 it is the
default compile's SASS (``python -m dsahal.backends.nvidia.aot --invariant``). This script checks that on the GPU, then
times it. Checks first, with the compile budget installed in batch-invariant mode as the NVIDIA plugin installs it:

1. every launch took the twin that keeps the cache's and the launcher-aligned facts (never the fully generic one);
2. rows computed in batches of 1, 7 and 64 tokens, the batch shuffled, the batch's queries at an odd offset
   (a slice of a wider buffer) and the batch run in launches of 40 tokens (the partials' bound lowered,
   ``triton_kernels/partials.py``) are bitwise equal to the same rows of the whole batch; the float64 reference within
   its bound; fp8_ds_mla and bf16 latents, H = 128 and 64, -1 slots and an empty row;

then times, in the same run (median of CUDA events): default mode, batch-invariant mode with its fixed 512-slot
splits, and batch-invariant mode with 1024- and 2048-slot splits (candidates for 64+ heads, where the default mode
does not split a large batch), at 64 x 5, 64 x 1 and 8 x 1 tokens, 2048 slots each, in one table; and a
4096-token batch-invariant prefill at H = 128 as one launch (4 GiB of partials) against launches of 511 tokens (the
partials' 512 MiB bound): the bound's cost.
``--cpu-smoke``: tiny shapes under the Triton interpreter (no compile, so no twin: step 1 says so); every other step
runs and the times mean nothing.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pools as cache_pools  # noqa: E402 (scripts/h200/pools.py)
from script_cli import finish, run, smoke_args, start  # noqa: E402

SCALE = 192 ** -0.5
BLOCK = 64


def set_mode(invariant: bool) -> None:
    """The process's mode, as a backend built in it would read it: the config's flag and the compile budget."""
    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels import compile_budget

    os.environ["DSAHAL_BATCH_INVARIANT"] = "1" if invariant else "0"
    config.read_mode()
    for cached in config._CACHED:
        cached.cache_clear()
    compile_budget.install(invariant=invariant)


def make_case(torch, gen, fmt: str, pool_tokens: int, tokens: int, heads: int, k: int, q_dtype, device: str):
    """fp8_ds_mla or bf16 pages of ``pool_tokens`` random latents (:mod:`pools`), q ``[tokens, heads, 576]`` and
    slots ``[tokens, k]`` (every 17th from the 4th -1)."""
    pages, _ = cache_pools.latent_pools(torch, [fmt], pool_tokens, device, BLOCK)[fmt]
    slots = torch.randint(0, pool_tokens, (tokens, k), generator=gen, dtype=torch.int32, device=device)
    slots[:, 3::17] = -1
    q = torch.randn(tokens, heads, 576, generator=gen, device=device).to(q_dtype)
    return pages, q, slots


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def checks(torch, gen, device: str, smoke: bool) -> tuple[list, list]:
    """Steps 1 and 2 in batch-invariant mode: (lines, failures)."""
    import dsahal
    from dsahal import ops
    from dsahal.backends.nvidia import config
    from dsahal.backends.nvidia import ops as nvidia_ops
    from dsahal.backends.triton_kernels import compile_budget, partials

    lines, failures = [], []
    set_mode(True)
    tokens, k, pool = (9, 64, 1 << 10) if smoke else (96, 2048, 1 << 18)
    head_counts = (16,) if smoke else (128, 64)
    q_dtype = torch.float32 if smoke else torch.bfloat16  # (the interpreter's bf16 dots are not to be trusted)
    for fmt in ("fp8_ds_mla", "bf16"):
        for heads in head_counts:
            pages, q, slots = make_case(torch, gen, fmt, pool, tokens, heads, k, q_dtype, device)
            slots[2] = -1  # a row with no valid slot
            name = f"{fmt} H={heads} T={tokens} k={k}"
            o_all, lse_all = nvidia_ops.sparse_mla(q, pages, slots, fmt, None, SCALE)
            with dsahal.use_backend("reference"):
                o_ref, lse_ref = ops.sparse_mla(q.float(), pages, slots, kv_fmt=fmt, kv_scale=None, softmax_scale=SCALE)
            err = rel(o_all, o_ref)
            finite = torch.isfinite(lse_ref)
            lse_err = float((lse_all[finite] - lse_ref[finite]).abs().max())
            empty = bool((o_all[2] == 0).all()) and bool(torch.isneginf(lse_all[2]).all())
            good = err < 2e-2 and lse_err < 2e-2 and empty
            lines.append(f"{'pass' if good else 'FAIL'} reference {name}: o rel err {err:.1e}, lse diff {lse_err:.1e}, "
                         f"empty row {'ok' if empty else 'WRONG'}")
            failures += [] if good else [lines[-1]]
            bad = []
            for size in (1, 7, 64):
                size = min(size, tokens - 1)
                o, lse = nvidia_ops.sparse_mla(q[-size:], pages, slots[-size:], fmt, None, SCALE)
                if not (torch.equal(o, o_all[-size:]) and torch.equal(lse, lse_all[-size:])):
                    bad.append(size)
            perm = torch.randperm(tokens, generator=gen, device=device)
            o, lse = nvidia_ops.sparse_mla(q[perm], pages, slots[perm], fmt, None, SCALE)
            if not (torch.equal(o, o_all[perm]) and torch.equal(lse, lse_all[perm])):
                bad.append("shuffled")
            real_budget = partials.PARTIALS_BUDGET_BYTES  # launches of 40 tokens: the partials bounded
            partials.PARTIALS_BUDGET_BYTES = 40 * partials.partial_bytes_per_token(heads, k, config.INVARIANT_SPLIT)
            try:
                o, lse = nvidia_ops.sparse_mla(q, pages, slots, fmt, None, SCALE)
            finally:
                partials.PARTIALS_BUDGET_BYTES = real_budget
            if not (torch.equal(o, o_all) and torch.equal(lse, lse_all)):
                bad.append("launches of 40 tokens (partials bounded)")
            wide = torch.zeros(tokens, heads, 577, dtype=q.dtype, device=device)
            wide[:, :, 1:] = q
            o, lse = nvidia_ops.sparse_mla(wide[:, :, 1:], pages, slots, fmt, None, SCALE)
            if not (torch.equal(o, o_all) and torch.equal(lse, lse_all)):
                bad.append("queries at an odd offset")
            lines.append(f"{'pass' if not bad else 'FAIL'} invariance {name}: rows of batches 1/7/64, shuffled, "
                         f"odd-offset queries, launches of 40 tokens vs the whole batch " + ("bitwise equal" if not bad else f"differ: {bad}"))
            failures += [] if not bad else [lines[-1]]
    if smoke:
        lines.append("info twins: none under the interpreter (nothing is compiled)")
    else:
        wanted = ("sparse_mla:sparse_mla_kernel", "lse_combine:lse_combine_kernel")
        stats = {key.rsplit(".", 1)[-1]: w.stats() for key, w in compile_budget.installed().items()
                 if key.endswith(wanted)}
        good = len(stats) == len(wanted) and all(s["generic_calls"] == 0 and s["cache_twin_calls"] > 0
                                                 for s in stats.values())
        lines.append(f"{'pass' if good else 'FAIL'} twins: {stats} (expected: every call on the twin that keeps the "
                     f"cache's and the launcher-aligned facts)")
        failures += [] if good else [lines[-1]]
    set_mode(False)
    return lines, failures


def timings(torch, gen, device: str, smoke: bool) -> list:
    """Step 3: one table of ms, same run."""
    import timing
    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels import partials
    from dsahal.backends.triton_kernels import sparse_mla as mla

    pool = 1 << 10 if smoke else 1 << 21  # 2M tokens of 656 B: the gathers miss L2 as at 128K x 64 requests
    k = 64 if smoke else 2048
    shapes = ((16, 8, "8 tok"),) if smoke else ((128, 320, "64x5"), (128, 64, "64x1"), (128, 8, "8x1"),
                                                 (64, 320, "64x5"), (64, 64, "64x1"))
    q_dtype = torch.float32 if smoke else torch.bfloat16
    pages = make_case(torch, gen, "fp8_ds_mla", pool, 1, 16, k, q_dtype, device)[0]
    rows = ["| fp8_ds_mla, 2048 slots | default ms | invariant ms (512-slot splits) | invariant / default | "
            "invariant, 1024-slot splits | invariant, 2048 (one split) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for heads, tokens, label in shapes:
        _, q, slots = make_case(torch, gen, "fp8_ds_mla", BLOCK, tokens, heads, k, q_dtype, device)
        slots = torch.randint(0, pool, (tokens, k), generator=gen, dtype=torch.int32, device=device)
        times = {}
        for mode in ("default", "invariant"):
            set_mode(mode == "invariant")
            cfg = config.sparse_mla_config(tokens, heads, k, "fp8_ds_mla", q.dtype)
            splits = (None,) if mode == "default" else (None, 1024, 2048)
            for split in splits:
                launch = dict(cfg) if split is None else dict(cfg, split_size=split)
                call = (lambda launch=launch: mla.sparse_mla(q, pages, slots, "fp8_ds_mla", None, SCALE, **launch))
                call()
                times[(mode, split)] = timing.bench_ms(call, device)
        set_mode(False)
        d, i = times[("default", None)], times[("invariant", None)]
        rows.append(f"| {label}, H={heads} | {d:.3f} | {i:.3f} | {i / d:.2f}x | {times[('invariant', 1024)]:.3f} | "
                    f"{times[('invariant', 2048)]:.3f} |")
    rows += ["", "| batch-invariant, H=128, 4096-token prefill, 2048 slots | one launch (4 GiB of partials) ms | "
                 "launches of 511 tokens (the 512 MiB bound) ms | ratio |", "| --- | ---: | ---: | ---: |"]
    tokens = 16 if smoke else 4096
    _, q, _ = make_case(torch, gen, "fp8_ds_mla", BLOCK, tokens, 128 if not smoke else 16, k, q_dtype, device)
    slots = torch.randint(0, pool, (tokens, k), generator=gen, dtype=torch.int32, device=device)
    set_mode(True)
    cfg = config.sparse_mla_config(tokens, q.shape[1], k, "fp8_ds_mla", q.dtype)
    call = (lambda: mla.sparse_mla(q, pages, slots, "fp8_ds_mla", None, SCALE, **cfg))
    bounded = timing.bench_ms(call, device)
    real_budget = partials.PARTIALS_BUDGET_BYTES
    partials.PARTIALS_BUDGET_BYTES = 1 << 40
    try:
        whole = timing.bench_ms(call, device)
    finally:
        partials.PARTIALS_BUDGET_BYTES = real_budget
        set_mode(False)
    rows.append(f"| fp8_ds_mla | {whole:.3f} | {bounded:.3f} | {bounded / whole:.2f}x |")
    return rows


def main(argv=None) -> int:
    args = smoke_args(__doc__.splitlines()[0], argv)
    device = "cpu" if args.cpu_smoke else "cuda"
    torch, _, started, _ = start("invariant_mla_check", device)
    gen = torch.Generator(device=device).manual_seed(31)
    lines, failures = checks(torch, gen, device, args.cpu_smoke)
    print("\n".join(lines))
    if not failures:
        print("\n" + "\n".join(timings(torch, gen, device, args.cpu_smoke)))
    return finish("invariant_mla_check", failures, started)


if __name__ == "__main__":
    run("invariant_mla_check", main)
