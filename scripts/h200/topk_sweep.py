"""Exact top-k (k = 2048) on one Hopper GPU: torch.topk, the NVIDIA backend's default and the max-bound
kernels (``dsahal.backends.triton_kernels.topk_bound`` / ``topk_groups``), on real lightning-indexer scores.

Usage (on a CUDA machine, from the repository with dsahal importable)::

    python scripts/h200/topk_sweep.py [--cpu-smoke] [--prefill | --short]

Steps, in order, each printed:

1. device-to-device copy ceiling (1 GiB copy, read + write bytes / time) measured in this run;
2. scores: the NVIDIA indexer (``indexer_score``, FP8 queries on random FP8 keys, 32 heads, the backend's
   tuned config) for 64 requests x 5 decode tokens at 128K context (-inf past each token's position).
   Three cases are cut from them: ``decode 320x128K`` (as they are), ``decode 320x4K`` (the first 4096
   columns: early decode) and ``prefill 4096x32K`` (the first 32768 columns tiled to 4096 rows, causal
   lengths ``8 (t + 1)``: rows of 8 .. 32768 entries, 1/16 of them shorter than k, a quarter shorter than 8K);
3. every variant checked before it is timed, on every row: the chosen set equals the set torch.topk implies
   under the tie rule (everything above the k-th value, then the first entries equal to it in index
   order; no -inf), no duplicates, -1 padding last, and on 8 rows per case the float64 reference's set
   exactly; the bound kernels' index order too; then one bound and one groups variant, the backend's 128K
   launch and its 4K launch (the registers method) captured in a CUDA graph and replayed on other scores;
4. ``triton.testing.do_bench`` medians; one table: case, variant, ms, (scores + output bytes) / time,
   % of the copy ceiling, torch.topk ms / variant ms, and the bound kernels' survivors per row (mean / max);
5. the decode case's top-k at the NVIDIA config for 128K (groups) launch by launch, with and without
   ``segment_histograms`` and ``compact_prefetch`` (:data:`TAIL_PHASES`, :func:`phase_times`): a second table.

``--prefill`` (where does the top-k spend its time on prefill rows and short rows?): the cases are
``prefill 4096x32K`` (causal, as above), ``decode 320x4K`` and four more cut from the same scores,
``decode 320x8K``, ``decode 320x16K``, ``decode 320x32K`` and ``decode 320x48K`` (the first 8192 / 16384 / 32768 /
49152 columns; every row full length, since each token's position is near 128K); the variants are :data:`PREFILL_VARIANTS` (one program
per row at larger chunks and more warps, bound and groups at other chunk / finish sizes, split rows) instead of
:data:`VARIANTS`; no CUDA graph check. Then a second table: the NVIDIA default at 32K (the bound method: four launches) split into its
launches, each timed alone at ``prefill 4096x32K`` and ``decode 320x32K`` (:func:`phase_times`), with one line
of its survivors per row by row length (quarters of the width).

``--short`` (which method for rows of 4K-16K, the registers method's widths?): ``decode 320x4K``, ``320x8K`` and
``320x16K`` only, with :data:`SHORT_VARIANTS` (the defaults, the radix program, the bound method, the registers method
at 4 / 8 / 16 warps): a dozen compiles (the whole ``--prefill`` sweep outran a 100 s step on an H100).

A failed check is listed and the script exits with one ``error:`` line (after timing what did pass).
Runs in about a minute on an H200 (``--prefill``: 1-1.5 minutes, ~30 Triton compiles), most of it Triton
compiles and the indexer.
"""
from __future__ import annotations

import argparse
import sys
import time

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
from script_cli import CheckError, finish, run  # scripts/h200/script_cli.py

K = 2048
HEADS = 32
BLOCK_TOKENS = 64
REQUESTS, PER_REQUEST, CONTEXT = 64, 5, 131072
SHORT, PREFILL_ROWS, PREFILL_WIDTH = 4096, 4096, 32768
REFERENCE_ROWS = 8
DEVICE = "cuda"  # --cpu-smoke: "cpu" under TRITON_INTERPRET=1
SMOKE_DIVISOR = 1  # --cpu-smoke: chunk sizes divided by this (tiny rows)

# Thirty-third session: rows of <= 16K whole in one program's registers (topk_registers), read once; the cases of
# wider rows skip them.
REGISTERS = (
    ("registers w4", dict(method="registers", num_warps=4)),
    ("registers w8", dict(method="registers", num_warps=8)),
    ("registers w16", dict(method="registers", num_warps=16)),
)
# (name, kwargs of dsahal.backends.triton_kernels.topk.topk); "default" (None) is the NVIDIA config's for the
# case's width, labelled with its method
VARIANTS = (
    ("default", None),
    ("radix 1 prog/row", dict(chunk=2048, row_levels=2, num_warps=8, segments=1)),
    ("bound c1024 f512", dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4)),
    ("bound c2048w8 f512", dict(method="bound", chunk=2048, num_warps=8, finish_chunk=512, finish_warps=4)),
    ("groups c1024 b64 f512", dict(method="groups", chunk=1024, batch=64, num_warps=4, finish_chunk=512,
                                   finish_warps=4)),
    ("groups c2048w8 b64", dict(method="groups", chunk=2048, batch=64, num_warps=8, finish_chunk=512, finish_warps=4)),
    ("groups c1024s32 f1024", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4, finish_chunk=1024,
                                   finish_warps=8)),
    # thirteenth session: the groups default's neighbours (the top-k is ~15% of the DSA layer at 64x5 x 128K)
    ("groups c1024s32 b128 f1024", dict(method="groups", chunk=1024, steps=32, batch=128, num_warps=4,
                                        finish_chunk=1024, finish_warps=8)),
    ("groups G8 c1024s32 f1024", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4, group_size=8,
                                      finish_chunk=1024, finish_warps=8)),
    ("groups c1024s32 f2048w16", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4,
                                      finish_chunk=2048, finish_warps=16)),
    ("groups c2048s16w8 f1024", dict(method="groups", chunk=2048, steps=16, batch=64, num_warps=8,
                                     finish_chunk=1024, finish_warps=8)),
    # twenty-eighth session (written on the CPU, not yet run on the H200): the groups default with segment
    # histograms (the threshold reads the maxima once, not twice; the finish the survivors three times, not four)
    ("groups c1024s32 f1024 seg-hist", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4,
                                            finish_chunk=1024, finish_warps=8, segment_histograms=True)),
    ("groups c1024s32 f1024 prefetch", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4,
                                            finish_chunk=1024, finish_warps=8, compact_prefetch=True)),
    ("groups c1024s32 f1024 seg-hist prefetch", dict(method="groups", chunk=1024, steps=32, batch=64, num_warps=4,
                                                     finish_chunk=1024, finish_warps=8, segment_histograms=True,
                                                     compact_prefetch=True)),
    # ... and the bound method's (batch-invariant mode's at every width)
    ("bound c1024 f512 seg-hist", dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4,
                                       segment_histograms=True)),
    *REGISTERS,
)
# The decode case's launches timed one by one (decode mode): the NVIDIA config at 128K (the groups method) with
# and without segment histograms (and the compaction's prefetch), so each launch's change is seen apart.
TAIL_PHASES = (dict(segment_histograms=False, compact_prefetch=False),
               dict(segment_histograms=True, compact_prefetch=False),
               dict(segment_histograms=True, compact_prefetch=True))

# --prefill: rows of 4K-32K entries, many rows. The defaults there are one program per row (<= 8K: chunk 2048, 8
# warps) and bound (8K-64K: chunk 1024, 4 warps, finish 512 at 4 warps); these are their neighbours. Larger radix
# chunks halve or quarter the loop trips of the two whole-row histogram passes (and row_levels 1 drops one of
# them, for a longer candidate list); bound's chunk sets the row passes' width, its finish_chunk / finish_warps
# the per-row finish (one program per row: a latency chain of small histograms), group 8 halves the lane maxima
# the per-row threshold pass bins (8192 a row at 32K with the automatic group 4); split rows (topk_split) spread
# 320 rows of 16K-32K over more programs (18 variants with the last: ~75 s on an H200 with compiles).
PREFILL_VARIANTS = (
    ("default", None),
    ("radix c2048w8", dict(chunk=2048, row_levels=2, num_warps=8, segments=1)),
    ("radix c2048w8 L1", dict(chunk=2048, row_levels=1, num_warps=8, segments=1)),
    ("radix c4096w8", dict(chunk=4096, row_levels=2, num_warps=8, segments=1)),
    ("radix c4096w16", dict(chunk=4096, row_levels=2, num_warps=16, segments=1)),
    ("radix c4096w16 L1", dict(chunk=4096, row_levels=1, num_warps=16, segments=1)),
    ("radix c8192w16", dict(chunk=8192, row_levels=2, num_warps=16, segments=1)),
    ("radix c8192w32", dict(chunk=8192, row_levels=2, num_warps=32, segments=1)),
    ("bound c1024w4 f1024w8", dict(method="bound", chunk=1024, num_warps=4, finish_chunk=1024, finish_warps=8)),
    ("bound c1024w4 g8 f1024w8", dict(method="bound", chunk=1024, group=8, num_warps=4, finish_chunk=1024,
                                      finish_warps=8)),
    ("bound c2048w8 f512w4", dict(method="bound", chunk=2048, num_warps=8, finish_chunk=512, finish_warps=4)),
    ("bound c2048w8 f1024w8", dict(method="bound", chunk=2048, num_warps=8, finish_chunk=1024, finish_warps=8)),
    ("bound c4096w8 f2048w8", dict(method="bound", chunk=4096, num_warps=8, finish_chunk=2048, finish_warps=8)),
    ("groups c1024s8 f1024w8", dict(method="groups", chunk=1024, steps=8, batch=64, num_warps=4, finish_chunk=1024,
                                    finish_warps=8)),
    ("groups c1024s16 f1024w8", dict(method="groups", chunk=1024, steps=16, batch=64, num_warps=4,
                                     finish_chunk=1024, finish_warps=8)),
    ("radix c2048w8 2 seg", dict(chunk=2048, row_levels=2, num_warps=8, segments=2)),
    ("radix c2048w8 4 seg", dict(chunk=2048, row_levels=2, num_warps=8, segments=4)),
    ("radix c2048w8 8 seg", dict(chunk=2048, row_levels=2, num_warps=8, segments=8)),
    # twenty-eighth session (not yet run on the H200): the 8K-64K default (bound) with segment histograms
    ("bound c1024w4 f512w4 seg-hist", dict(method="bound", chunk=1024, num_warps=4, finish_chunk=512, finish_warps=4,
                                           segment_histograms=True)),
    *REGISTERS,
)
REGISTERS_MAX_WIDTH = 16384  # topk_registers.MAX_WIDTH (not imported here: Triton is imported after the mode is set)
MID_WIDTHS = (8192, 16384, 32768, 49152)  # --prefill: the 320-row cases besides 4K (8K and 16K: the registers
# method beside the radix program and the bound method; the rest the bound method)
PHASE_WIDTH = 32768  # --prefill: the launches of the NVIDIA default at this width are timed one by one
# --short (which method for rows of 4K-16K? the registers route's width): decode 320 x 4K / 8K / 16K, the defaults and
# the registers method only (a dozen compiles: the whole --prefill sweep outran a 100 s step on an H100)
SHORT_WIDTHS = (4096, 8192, 16384)
SHORT_VARIANTS = tuple(v for v in VARIANTS if v[0] in ("default", "radix 1 prog/row", "bound c1024 f512")
                       or v in REGISTERS)



def _bench(fn):
    return timing.bench_ms(fn, DEVICE, warmup=10, rep=60)


def _kwargs(kw, width):
    """``kw`` (None: the NVIDIA config for rows of ``width``) with the chunk sizes cut for --cpu-smoke."""
    from dsahal.backends.nvidia.config import topk_config

    kw = dict(topk_config(width)) if kw is None else dict(kw)
    for name in ("chunk", "finish_chunk"):
        if name in kw:
            kw[name] = max(16, kw[name] // SMOKE_DIVISOR)
    return kw


def indexer_scores(torch):
    """``[R x P, C]`` fp32 indexer output for R requests of P decode tokens at context C (FP8 keys)."""
    from dsahal.backends.nvidia.config import indexer_config
    from dsahal.backends.triton_kernels.indexer import indexer_score
    from dsahal.bench.inputs import decode_batch, random_pages

    block_table, req_ids, positions, num_blocks = decode_batch(REQUESTS, PER_REQUEST, CONTEXT, BLOCK_TOKENS, DEVICE)
    pages = random_pages("index", "fp8", num_blocks, BLOCK_TOKENS, DEVICE)
    tokens = req_ids.shape[0]
    q = torch.randn(tokens, HEADS, 128, device=DEVICE)
    q = q.to(torch.float8_e4m3fn) if DEVICE == "cuda" else q  # the interpreter's float -> e4m3 cast is wrong
    w = torch.rand(tokens, HEADS, device=DEVICE)
    cfg = indexer_config(HEADS, q.dtype, "fp8")
    scores = indexer_score(q, w, pages, block_table, req_ids, positions, "fp8", CONTEXT, **cfg)
    return scores, (positions + 1).to(torch.int32)


def build_cases(torch, scores, lengths):
    """(name, scores [T, N], lengths [T] int32) per case, cut from the indexer output."""
    short = scores[:, :SHORT].contiguous()
    tiled = scores[:, :PREFILL_WIDTH].repeat(-(-PREFILL_ROWS // scores.shape[0]), 1)[:PREFILL_ROWS].contiguous()
    causal = (torch.arange(PREFILL_ROWS, device=DEVICE, dtype=torch.int32) + 1) * (PREFILL_WIDTH // PREFILL_ROWS)
    tiled.masked_fill_(torch.arange(PREFILL_WIDTH, device=DEVICE)[None, :] >= causal[:, None], float("-inf"))
    return [
        (f"decode {scores.shape[0]}x{_width(scores.shape[1])}", scores, lengths),
        (f"decode {short.shape[0]}x{_width(SHORT)}", short, torch.clamp(lengths, max=SHORT)),
        (f"prefill {PREFILL_ROWS}x{_width(PREFILL_WIDTH)}", tiled, causal),
    ]


def build_prefill_cases(torch, scores, lengths):
    """--prefill: ``prefill 4096x32K`` (causal), ``decode 320x4K``, then the first 8K, 16K, 32K and 48K columns of the
    decode scores (every row full length: each token's position is near the 128K context)."""
    _, short, prefill = build_cases(torch, scores, lengths)
    mid = [(f"decode {scores.shape[0]}x{_width(width)}", scores[:, :width].contiguous(),
            torch.clamp(lengths, max=width)) for width in MID_WIDTHS]
    return [prefill, short, *mid]


def build_short_cases(torch, scores, lengths):
    """--short: the first 4K, 8K and 16K columns of the decode scores (every row full length)."""
    return [(f"decode {scores.shape[0]}x{_width(width)}", scores[:, :width].contiguous(),
             torch.clamp(lengths, max=width)) for width in SHORT_WIDTHS]


def _width(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def expected_mask(torch, scores, lengths, k):
    """``[T, N]`` bool: the tie rule's choice, from torch.topk's k-th value (nothing -inf)."""
    width = scores.shape[1]
    cols = torch.arange(width, device=scores.device)
    masked = torch.where(cols[None, :] < lengths[:, None].long(), scores, torch.full_like(scores, float("-inf")))
    tau = torch.topk(masked, min(k, width), dim=1).values[:, -1:]
    finite = masked != float("-inf")
    above = (masked > tau) & finite
    equal = (masked == tau) & finite
    need = min(k, width) - above.sum(dim=1, keepdim=True, dtype=torch.int32)
    return above | (equal & (torch.cumsum(equal.to(torch.int32), dim=1, dtype=torch.int32) <= need))


def check(torch, name, got, scores, lengths, k, want_mask, index_order):
    """Empty string when ``got [T, k]`` is the tie rule's set with -1 padding last, else what is wrong."""
    from dsahal.reference.topk import topk as reference

    tokens, width = scores.shape
    if tuple(got.shape) != (tokens, k) or got.dtype != torch.int32:
        return f"{name}: output {tuple(got.shape)} {got.dtype}, expected ({tokens}, {k}) int32"
    valid = got >= 0
    if bool((valid[:, 1:] & ~valid[:, :-1]).any()):
        return f"{name}: a valid index after -1 padding"
    if bool((valid & (got >= lengths[:, None])).any()) or bool((got < -1).any()):
        return f"{name}: an index outside [0, length) or below -1"
    hits = torch.zeros(tokens, width, dtype=torch.int32, device=got.device)
    hits.scatter_add_(1, got.clamp(0, width - 1).long(), valid.to(torch.int32))
    bad = (hits != want_mask.to(torch.int32)).any(dim=1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        return (f"{name}: {int(bad.sum())} of {tokens} rows differ from the tie rule's set, first row {row} "
                f"(length {int(lengths[row])}: {int(hits[row].sum())} chosen, {int(want_mask[row].sum())} expected, "
                f"{int((hits[row] > 1).sum())} duplicates)")
    if index_order:
        shifted = torch.where(valid, got, torch.iinfo(torch.int32).max)
        if bool((valid[:, 1:] & (shifted[:, 1:] <= shifted[:, :-1])).any()):
            return f"{name}: valid indices not in increasing index order"
    rows = torch.linspace(0, tokens - 1, REFERENCE_ROWS, device=got.device).long().unique()
    want = reference(scores[rows].double(), lengths[rows], k)
    if not torch.equal(got[rows].sort(dim=1).values, want.sort(dim=1).values):
        return f"{name}: differs from the float64 reference on rows {rows.tolist()}"
    return ""


def check_graph(torch, scores, lengths, kw, failures):
    """A top-k launch (``kw``) captured in a CUDA graph (no host sync may happen inside), replayed on new scores."""
    from dsahal.backends.triton_kernels.topk import topk

    static = scores.clone()
    eager = topk(static, lengths, K, **kw)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk(static, lengths, K, **kw)
    static.copy_(scores.flip(0))
    graph.replay()
    want = topk(static, lengths, K, **kw)
    ok = torch.equal(out, want) and not torch.equal(out, eager)
    print(f"  check CUDA graph replay of {kw}: {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(f"{kw['method']} kernel: a CUDA graph replay on new scores differs from an eager call")


def survivors_per_row(torch, scores, lengths, kw):
    """``[T]`` int32: entries at or above each row's bound for a bound / groups ``kw`` (one more call)."""
    from dsahal.backends.triton_kernels.topk_bound import topk_bound
    from dsahal.backends.triton_kernels.topk_groups import topk_groups

    stats = {}
    out = torch.empty(scores.shape[0], K, dtype=torch.int32, device=DEVICE)
    direct = topk_bound if kw["method"] == "bound" else topk_groups
    direct(scores, lengths, K, out, False, lengths, lengths.view(1, -1), 1, stats=stats,
           **{key: value for key, value in kw.items() if key != "method"})
    return stats["survivors"]


def run_case(torch, case, variants, rows, failures):
    from dsahal.backends.triton_kernels.topk import topk

    name, scores, lengths = case
    tokens, width = scores.shape
    nbytes = tokens * width * 4 + tokens * K * 4
    want_mask = expected_mask(torch, scores, lengths, K)
    peer_ms = _bench(lambda: torch.topk(scores, min(K, width), dim=1))
    rows.append((name, "torch.topk", peer_ms, nbytes / (peer_ms * 1e-3) / 1e9, 1.0, ""))
    for variant, raw in variants:
        kw = _kwargs(raw, width)
        if kw.get("method") == "registers" and width > REGISTERS_MAX_WIDTH:
            continue  # (rows wider than one program's registers hold: not served)
        if raw is None:
            variant = f"{variant} ({kw.get('method', 'radix')})"
        try:
            got = topk(scores, lengths, K, **kw)
            problem = check(torch, variant, got, scores, lengths, K, want_mask,
                            kw.get("method") in ("bound", "groups", "registers"))
        except Exception as exc:  # noqa: BLE001 - a variant that fails to compile or run is listed
            problem = f"{variant}: {type(exc).__name__}: {str(exc)[:200]}"
        print(f"  check {name:<18s} {variant:<24s} {problem or 'ok'}", flush=True)
        if problem:
            failures.append(f"{name}: {problem}")
            continue
        survivors = ""
        if kw.get("method") in ("bound", "groups"):
            count = survivors_per_row(torch, scores, lengths, kw).float()
            survivors = f"{count.mean().item():.0f} / {count.max().item():.0f}"
        ms = _bench(lambda: topk(scores, lengths, K, **kw))
        rows.append((name, variant, ms, nbytes / (ms * 1e-3) / 1e9, peer_ms / ms, survivors))
        # (each timing as it comes, too: a step stopped at its limit still shows what it timed)
        print(f"  time  {name:<18s} {variant:<24s} {ms:.4f} ms, torch.topk {peer_ms:.4f}", flush=True)
    del want_mask


class _Recorder:
    """Stands in for one module-level ``*_kernel`` while a top-k call runs: each ``kernel[grid](...)`` is
    appended to ``launches`` as ``(name, kernel, grid, args, kwargs)`` and then launched as usual."""

    def __init__(self, name, kernel, launches):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((self.name, self.kernel, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


def recorded_launches(torch, scores, lengths, kw):
    """One ``topk(scores [T, N], lengths [T], K, **kw)`` call -> (out [T, K] int32, its launches in order).

    The launchers (``topk_bound.topk_bound`` and the others) find their kernels by module global at each call,
    so swapping those for :class:`_Recorder` while the call runs records each launch with its real grid and
    arguments (the scratch buffers the call allocated stay alive in them) and changes nothing else."""
    from triton.runtime.jit import KernelInterface  # JITFunction, and InterpretedFunction under the interpreter

    from dsahal.backends.triton_kernels import topk as topk_module, topk_bound, topk_groups, topk_split
    from dsahal.kernel_launch import LaunchedKernel

    launches, saved = [], []
    try:
        for module in (topk_module, topk_bound, topk_groups, topk_split):
            for name, kernel in list(vars(module).items()):
                if not (name.endswith("_kernel") and isinstance(kernel, (KernelInterface, LaunchedKernel))):
                    continue
                saved.append((module, name, kernel))
                setattr(module, name, _Recorder(name, kernel, launches))
        out = topk_module.topk(scores, lengths, K, **kw)
    finally:
        for module, name, kernel in saved:
            setattr(module, name, kernel)
    return out, launches


def phase_times(torch, case, kw, phase_rows, failures):
    """Each launch of one ``topk`` call at ``case`` timed alone (the rows of the phase table).

    One recorded call first, checked like every variant, so the scratch buffers its launches share (lane
    maxima, bounds, survivor lists and counts for the bound method) hold the real intermediate data; then each
    launch is replayed with the same grid and arguments under ``do_bench``. Each rewrites what it wrote before,
    the same values (checked afterwards: the output is unchanged). ``do_bench`` empties L2 before each run, so
    a phase that in the whole call reads what the previous launch just left in L2 is timed from HBM here; the
    phases may add up to more than the whole call."""
    name, scores, lengths = case
    method = kw.get("method", "radix")
    want_mask = expected_mask(torch, scores, lengths, K)
    try:
        out, launches = recorded_launches(torch, scores, lengths, kw)
        first = out.clone()
        problem = check(torch, f"phases {method}", out, scores, lengths, K, want_mask, method in ("bound", "groups"))
    except Exception as exc:  # noqa: BLE001 - listed like a variant's failure
        problem = f"phases {method}: {type(exc).__name__}: {str(exc)[:200]}"
    del want_mask
    print(f"  check {name:<18s} {'phases ' + method:<24s} {problem or 'ok'}", flush=True)
    if problem:
        failures.append(f"{name}: {problem}")
        return
    if method in ("bound", "groups"):
        # The bound is tight when group * k <= length / 4, but the group is chosen from the width: short causal
        # rows get a loose bound (below ~8K entries at 32K: fewer than k lane maxima, everything survives) and
        # the per-row finish bins all their survivors. Survivors by row length show how much of the finish that is.
        count, width = survivors_per_row(torch, scores, lengths, kw).float(), scores.shape[1]
        parts = []
        for quarter in range(4):
            rows = (lengths > quarter * width // 4) & (lengths <= (quarter + 1) * width // 4)
            if bool(rows.any()):
                parts.append(f"length {quarter * width // 4}-{(quarter + 1) * width // 4}: "
                             f"{int(rows.sum())} rows, survivors mean {count[rows].mean().item():.0f} "
                             f"max {count[rows].max().item():.0f}")
        print(f"  survivors {name}: " + "; ".join(parts), flush=True)
    from dsahal.backends.triton_kernels.topk import topk

    whole = _bench(lambda: topk(scores, lengths, K, **kw))
    timed = []
    for kernel_name, kernel, grid, args, kwargs in launches:
        timed.append((kernel_name, grid, _bench(lambda: kernel[grid](*args, **kwargs))))
    if not torch.equal(out, first):
        failures.append(f"{name}: phases {method}: the replayed launches changed the output")
    label = f"{method} {' '.join(f'{key}={value}' for key, value in kw.items() if key != 'method')}"
    for kernel_name, grid, ms in timed:
        phase_rows.append((name, label, kernel_name, "x".join(str(g) for g in grid), ms, 100 * ms / whole))
    total = sum(ms for _, _, ms in timed)
    phase_rows.append((name, label, "sum of the launches", "", total, 100 * total / whole))
    phase_rows.append((name, label, "whole topk call", "", whole, 100.0))


def _smoke_mode() -> None:
    import os

    global DEVICE, K, REQUESTS, PER_REQUEST, CONTEXT, SHORT, PREFILL_ROWS, PREFILL_WIDTH, SMOKE_DIVISOR, BLOCK_TOKENS
    global MID_WIDTHS, SHORT_WIDTHS
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    DEVICE, K, REQUESTS, PER_REQUEST, CONTEXT, BLOCK_TOKENS = "cpu", 16, 2, 2, 512, 16
    SHORT, PREFILL_ROWS, PREFILL_WIDTH, SMOKE_DIVISOR, MID_WIDTHS = 64, 16, 128, 64, (96, 128, 256)
    SHORT_WIDTHS = (64, 128, 256)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1 (fp32 queries): runs every step of "
                             "the script, times nothing meaningful")
    parser.add_argument("--prefill", action="store_true",
                        help="prefill 4096x32K and decode 320 x 4K/8K/16K/32K/48K only, the PREFILL_VARIANTS, then the "
                             "NVIDIA default at 32K (bound) timed launch by launch")
    parser.add_argument("--short", action="store_true",
                        help="decode 320 x 4K/8K/16K only, the defaults, the radix program, the bound method and the "
                             "registers method (:data:`SHORT_VARIANTS`): which method for rows of 4K-16K")
    args = parser.parse_args(argv)
    if args.prefill and args.short:
        raise CheckError("topk_sweep: --prefill and --short are two sweeps; give one")
    if args.cpu_smoke:
        _smoke_mode()
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise CheckError("topk_sweep: needs a CUDA device, none is visible")
    started = time.time()
    import triton

    torch.manual_seed(0)
    ceiling = timing.announce(torch, triton, DEVICE)
    scores, lengths = indexer_scores(torch)
    finite = scores[torch.isfinite(scores)]
    print(f"indexer scores {tuple(scores.shape)}: finite min {finite.min().item():.3g} max {finite.max().item():.3g}, "
          f"{100 * (finite == 0).float().mean().item():.1f}% zeros ({time.time() - started:.0f} s)", flush=True)
    del finite
    rows, failures, phase_rows = [], [], []
    if args.short:
        cases, variants = build_short_cases(torch, scores, lengths), SHORT_VARIANTS
    elif args.prefill:
        cases, variants = build_prefill_cases(torch, scores, lengths), PREFILL_VARIANTS
    else:
        cases, variants = build_cases(torch, scores, lengths), VARIANTS
    for case in cases:
        run_case(torch, case, variants, rows, failures)
    if args.prefill:
        # the prefill case and the 320-row case of the same width (cases[0] and cases[4]: MID_WIDTHS[2])
        for case in (cases[0], cases[4]):
            phase_times(torch, case, _kwargs(None, PHASE_WIDTH), phase_rows, failures)
    elif not args.short:  # (--short: no launch-by-launch table, each method there is one or two launches)
        from dsahal.backends.nvidia.config import topk_config

        if DEVICE == "cuda":  # the bound and groups methods as such, then the backend's 128K launch (its options)
            for kw in (VARIANTS[2][1], VARIANTS[4][1], topk_config(1 << 17)):
                check_graph(torch, scores, lengths, _kwargs(kw, scores.shape[1]), failures)
            _, short, short_lengths = cases[1]  # and the 4K launch (the registers method since the 35th session)
            check_graph(torch, short, short_lengths, _kwargs(topk_config(SHORT), SHORT), failures)

        timed = []
        for extra in TAIL_PHASES:  # (the 128K config also under --cpu-smoke, whose rows are narrower)
            kw = dict(_kwargs(topk_config(1 << 17), scores.shape[1]), **extra)
            if kw.get("method") != "groups":
                kw.pop("compact_prefetch", None)  # the bound method's compaction has no prefetch option
            if kw not in timed:  # (the config may already hold an extra: each launch set is timed once)
                timed.append(kw)
                phase_times(torch, cases[0], kw, phase_rows, failures)
    print(f"\n| case | variant | ms | GB/s | % copy | torch.topk / variant | survivors mean / max |")
    print("|---|---|---:|---:|---:|---:|---|")
    for case, variant, ms, gbps, ratio, survivors in rows:
        print(f"| {case} | {variant} | {ms:.4f} | {gbps:.0f} | {100 * gbps / (ceiling * 1e3):.1f} | {ratio:.2f} | "
              f"{survivors} |")
    if phase_rows:
        print("\n| case | call | launch | grid | ms | % of the whole call |\n|---|---|---|---|---:|---:|")
        for case, label, launch, grid, ms, share in phase_rows:
            print(f"| {case} | {label} | {launch} | {grid} | {ms:.4f} | {share:.1f} |")
    return finish("topk_sweep", failures, started, "check(s) failed")


if __name__ == "__main__":
    run("topk_sweep", main)
