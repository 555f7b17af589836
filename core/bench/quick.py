"""``dsahal bench --quick``: the bench harness on the CPU at tiny shapes, so the bench path itself (checks
against the reference, builds, timing, report) runs in CI on a machine without a GPU.

Not a measurement: the times are host wall-clock medians of a few calls at shapes far below the GPU
cases of :mod:`.cases` (no ceilings, no % of ceiling). Each case is checked against the reference
backend before it is timed, exactly as in the GPU run; a failed check leaves the case untimed and
makes the command exit 1.

The run is a list of *sections*, one function each (``SECTIONS``): a section takes the backend's
name and the op filter and returns its :class:`~.report.Row` list, calling ``on_row`` as each row is
ready. A new section is a function added to ``SECTIONS``.
"""
from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch

from ..registry import use_backend
from . import cases as c
from .report import Row
from .timing import time_ms_host

DEVICE = torch.device("cpu")
OnRow = Optional[Callable[[Row], None]]


def _check(fn, **kw):
    return lambda device, backend: fn(device, backend, **kw)


def tiny_op_cases() -> list[c.Case]:
    """One case per op at shapes the float64 reference runs in well under a second on one core. The
    checks are :mod:`.cases`' own (their shapes are already small); the builds are the GPU cases'
    builders at tiny sizes. bf16 queries: the reference takes no FP8 query."""
    bf16 = torch.bfloat16
    return [
        c.Case("indexer bf16 q / fp8 keys", "indexer_score", "2x2 tok, ctx 512",
               c.build_indexer(2, 2, 512, q_dtype=bf16), _check(c.check_indexer, q_dtype=bf16)),
        c.Case("topk k=256", "topk", "[8, 4096]", c.build_topk(8, 4096, k=256), _check(c.check_topk)),
        c.Case("sparse MLA bf16", "sparse_mla", "8 tok, H=16, k=256",
               c.build_sparse_mla(8, 16, "bf16", k=256, pool_tokens=4096), _check(c.check_sparse_mla, heads=16)),
        c.Case("lse combine W=4", "lse_combine", "8 tok, H=16", c.build_lse_combine(4, 8, 16),
               _check(c.check_lse_combine)),
        c.Case("KDA decode", "kda_decode", "B=4, H=4", c.build_kda_decode(4, heads=4), _check(c.check_kda_decode)),
        c.Case("KDA prefill", "kda_prefill", "2x64 tok, H=4", c.build_kda_prefill(2, 64, heads=4),
               _check(c.check_kda_prefill)),
        c.Case("DSA layer decode", "dsa_attention", "1x2 tok, ctx 2304, H=16, k=2048",
               c.build_dsa(1, 2, 2304, 16), _check(c.check_dsa)),
        c.Case("cache write", "cache_write", "checks only", None, _check(c.check_cache_write)),
    ]


REPS = 3  # timed calls per case (after one warm-up): enough for a median at these sizes


def _timed(fn: Callable[[], object], backend: str) -> float:
    with use_backend(backend):
        return time_ms_host(fn, reps=REPS)


def _build(case: c.Case):
    """The case's inputs on the CPU. The GPU builders also attach fla peers when fla imports; fla warns
    on import without a GPU, and its peers are never timed here, so that warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        return case.build(DEVICE)


def ops_section(backend: str, ops: Optional[list[str]] = None, on_row: OnRow = None) -> list[Row]:
    """Every op's tiny case: the correctness check against the reference, then the backend's op and
    the plain-torch baseline timed on the host."""
    rows = []
    for case in tiny_op_cases():
        if ops and case.op not in ops:
            continue
        try:
            passed, detail = case.check(DEVICE, backend)
        except Exception as exc:  # noqa: BLE001 - a crashing op is a failed check, reported
            passed, detail = False, f"{type(exc).__name__}: {exc}"[:300]
        row = Row(case.name, case.op, case.shape, "pass" if passed else "FAIL", detail)
        if passed and case.build is not None:
            try:
                built = _build(case)
                row.ms = _timed(built.run, backend)
                if built.baseline is not None:
                    row.baseline_ms = time_ms_host(built.baseline, reps=REPS)
                    row.vs_torch = c.ratio(row.ms, row.baseline_ms)
            except Exception as exc:  # noqa: BLE001 - one broken case must not stop the run
                row.check, row.check_detail = "error", f"timing: {type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


DISPATCH_OP = "lse_combine"  # the op the dispatch section calls through each layer


def dispatch_section(backend: str, ops: Optional[list[str]] = None, on_row: OnRow = None) -> list[Row]:
    """The cost of one op call in each layer above its implementation (:mod:`.dispatch`), one row per
    layer; the check is that every layer returned (the numbers are host time on this CPU)."""
    from .dispatch import measure

    if ops and DISPATCH_OP not in ops:
        return []
    with use_backend(backend):
        layers = measure(DEVICE, calls=200, repeats=3)
    rows = []
    for layer in layers:
        row = Row(f"dispatch: {layer['layer']}", "lse_combine", f"{layer['shape']}", "pass",
                  f"{layer['over_route_us']:+.2f} us over the route function")
        row.ms = layer["us"] / 1e3
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


# name -> section function, in the order they run.
SECTIONS: dict[str, Callable[..., list[Row]]] = {"ops": ops_section, "dispatch": dispatch_section}


def section_ops() -> dict[str, set[str]]:
    """The ops each section has rows for (what ``--op`` can select in it)."""
    return {"ops": {case.op for case in tiny_op_cases()}, "dispatch": {DISPATCH_OP}}


def run_quick(backend: str, sections: Optional[list[str]] = None, ops: Optional[list[str]] = None,
              on_section: Optional[Callable[[str], None]] = None, on_row: OnRow = None) -> dict[str, list[Row]]:
    """Run the named sections (all when None) in ``SECTIONS`` order; returns {section: rows}."""
    unknown = sorted(set(sections or ()) - set(SECTIONS))
    if unknown:
        raise ValueError(f"dsahal bench --quick: argument '--section' expected one of {sorted(SECTIONS)}, "
                         f"got {unknown}")
    results = {}
    for name, section in SECTIONS.items():
        if sections and name not in sections:
            continue
        if on_section is not None:
            on_section(name)
        results[name] = section(backend, ops=ops, on_row=on_row)
    return results


def quick_header(backend: str) -> list[str]:
    return [
        f"dsahal bench --quick: backend {backend} on the CPU, tiny shapes; host wall-clock medians "
        f"(a test of the bench path, not a measurement: no ceilings)",
        "",
        "| op | shape | check | ms | torch ms | vs torch |",
        "| --- | --- | --- | --- | --- | --- |",
    ]


def quick_row_line(r: Row) -> str:
    fmt = lambda x, spec=".3f": "-" if x is None else format(x, spec)  # noqa: E731
    check = r.check if r.check == "pass" else f"{r.check}: {r.check_detail[:160]}"
    return (f"| {r.name} | {r.shape} | {check} | {fmt(r.ms)} | {fmt(r.baseline_ms)} | "
            f"{fmt(r.vs_torch, '.2f')}{'x' if r.vs_torch is not None else ''} |")
