"""Slot splits of the general sparse-MLA kernel at 64 and 128 heads: which split each call length wants, in both modes.

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/split_sweep.py [--cpu-smoke]

The general kernel (``backends/triton_kernels/sparse_mla.py``) serves 64+ heads where FlashMLA does not: fp8
per-tensor latents always (FlashMLA has no such format), every format without FlashMLA, and batch-invariant mode
always (FlashMLA's SM90 kernels have none). A row's 2048 slots may be split into ``split_size`` parts merged by their
LSE. Default mode splits until ``config.TARGET_PROGRAMS`` programs are in flight; batch-invariant mode splits
every call at ``config.INVARIANT_SPLIT`` slots (264 and 512 until this sweep's first run, on an H100 in the
thirty-fourth session, set 100 and 1024: ``backends/nvidia/config.py``). The thirty-third session's first H200 run (R1,
``invariant_mla_check.py``, fp8_ds_mla) had the default's split slower than fewer splits at 64 x 1 tokens (H = 128:
0.350 ms at 512 slots against 0.296 unsplit; H = 64: 0.215 at 256 against 0.169 at 1024), and 1024-slot invariant
splits faster than 512 at 64 x 5 and 64 x 1 (1.08-1.10x). This sweep measures the whole grid, every split checked
against the unsplit output first (the same slots, so within bf16 rounding of it), on a 2M-token pool (the gathers
miss L2 as at 128K x 64 requests), for fp8_ds_mla, fp8 and bf16 latents; then prints which ``TARGET_PROGRAMS`` and
which fixed invariant split give the least total time over the call lengths, with the shipped choice beside them.
``--cpu-smoke``: tiny shapes under the Triton interpreter, nothing timed.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pools as cache_pools  # noqa: E402 (scripts/h200/pools.py)
import timing  # noqa: E402 (scripts/h200/timing.py)
from script_cli import finish, run, smoke_args, start  # noqa: E402

SCALE = 192 ** -0.5
TARGETS = (32, 64, 100, 132, 200, 264, 400)  # candidate TARGET_PROGRAMS
SPLITS = (None, 256, 512, 1024)  # None: one split (the whole row)


def default_split(tokens: int, heads: int, k: int, block_h: int, block_n: int, target: int):
    """``config.sparse_mla_config``'s default-mode split rule with ``target`` programs wanted in flight."""
    programs, splits = tokens * -(-heads // block_h), 1
    while programs * splits < target and k // (splits * 2) >= 256:
        splits *= 2
    if splits == 1:
        return None
    per_split = -(-k // splits)
    return -(-per_split // block_n) * block_n  # (a multiple of the step, as the config rounds it)


def main(argv=None) -> int:
    args = smoke_args(__doc__.splitlines()[0], argv)
    device = "cpu" if args.cpu_smoke else "cuda"
    torch, _, started, _ = start("split_sweep", device)
    from dsahal.backends.nvidia import config
    from dsahal.backends.triton_kernels import sparse_mla as mla

    smoke = args.cpu_smoke
    pool, k = (1 << 10, 64) if smoke else (1 << 21, 2048)
    formats = ("fp8_ds_mla", "bf16") if smoke else ("fp8_ds_mla", "fp8", "bf16")
    head_counts = (16,) if smoke else (128, 64)
    lengths = (2, 3) if smoke else (8, 16, 32, 64, 128, 192, 320)
    splits = (None, 32) if smoke else SPLITS
    q_dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(7)
    failures, times = [], {}  # (fmt, heads, tokens, split) -> ms
    header = "| latents | H | tokens | " + " | ".join("unsplit" if s is None else f"{s}-slot splits" for s in splits)
    rows = [header + " | best | default's split |", "| --- | ---: | ---: |" + " ---: |" * (len(splits) + 2)]
    for fmt in formats:
        pages, scale = cache_pools.latent_pools(torch, [fmt], pool, device)[fmt]
        for heads in head_counts:
            for tokens in lengths:
                cfg = config.sparse_mla_config(tokens, heads, k, fmt, q_dtype)
                q = torch.randn(tokens, heads, 576, generator=gen, device=device).to(q_dtype)
                slots = torch.randint(0, pool, (tokens, k), generator=gen, dtype=torch.int32, device=device)
                slots[:, 3::17] = -1
                want = None
                for split in splits:
                    launch = dict(cfg, split_size=split)
                    call = (lambda launch=launch: mla.sparse_mla(q, pages, slots, fmt, scale, SCALE, **launch))
                    o, lse = call()
                    if want is None:
                        want = (o, lse)
                    else:
                        err = float((o.double() - want[0].double()).norm() / want[0].double().norm())
                        lse_err = float((lse - want[1]).abs().max())
                        if err > 1e-2 or lse_err > 1e-3:
                            failures.append(f"{fmt} H={heads} T={tokens} split {split}: o rel err {err:.1e}, "
                                            f"lse diff {lse_err:.1e} against the unsplit output")
                            continue
                    times[(fmt, heads, tokens, split)] = timing.bench_ms(call, device)
                got = {s: times.get((fmt, heads, tokens, s)) for s in splits}
                timed = {s: ms for s, ms in got.items() if ms is not None}
                best = min(timed, key=timed.get) if timed else None
                cells = " | ".join("-" if ms is None else f"{ms:.3f}" for ms in got.values())
                rows.append(f"| {fmt} | {heads} | {tokens} | {cells} | {'unsplit' if best is None else best} | "
                            f"{cfg.get('split_size')} |")
        del pages
    print("\n".join(rows))
    print(summary(times, formats, head_counts, lengths, splits, k, config))
    return finish("split_sweep", failures, started)


def summary(times, formats, head_counts, lengths, splits, k, config) -> str:
    """Totals over the call lengths: each TARGET_PROGRAMS candidate's default-mode rule (its split rounded to a
    timed one) and each fixed split (batch-invariant mode), per format and head count."""
    out = ["", "| latents | H | " + " | ".join(f"target {t}" for t in TARGETS) + " | shipped target "
           f"{config.TARGET_PROGRAMS} | " + " | ".join("invariant unsplit" if s is None else f"invariant {s}"
                                                     for s in splits) + " |",
           "| --- | ---: |" + " ---: |" * (len(TARGETS) + 1 + len(splits))]
    for fmt in formats:
        for heads in head_counts:
            block = config.sparse_mla_config(320, heads, k, fmt)
            cells = []
            for target in TARGETS + (config.TARGET_PROGRAMS,):
                total = 0.0
                for tokens in lengths:
                    split = default_split(tokens, heads, k, block["block_h"], block["block_n"], target)
                    split = min(splits, key=lambda s: abs((s or k) - (split or k)))  # the nearest timed split
                    total += times.get((fmt, heads, tokens, split), float("nan"))
                cells.append(f"{total:.3f}")
            for split in splits:
                cells.append(f"{sum(times.get((fmt, heads, t, split), float('nan')) for t in lengths):.3f}")
            out.append(f"| {fmt} | {heads} | " + " | ".join(cells) + " |")
    out.append(f"(sums of ms over the call lengths {', '.join(map(str, lengths))}; nan: a split that failed its check)")
    return "\n".join(out)


if __name__ == "__main__":
    run("split_sweep", main)
