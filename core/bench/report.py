"""Running the cases and reporting: table, JSON, roofline plot, progress bar."""
from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

from .cases import Case, batch_invariant_mode, ratio
from .timing import Ceilings, measure_ceilings, time_ms, time_ms_graph

INVARIANT_OPS = {"sparse_mla", "kda_prefill", "dsa_attention"}


@dataclass
class Row:
    name: str
    op: str
    shape: str
    check: str  # "pass" / "FAIL" / "error"
    check_detail: str
    ms: Optional[float] = None
    gbps: Optional[float] = None
    tflops: Optional[float] = None
    pct_ceiling: Optional[float] = None
    bound: str = ""
    baseline_ms: Optional[float] = None
    vs_torch: Optional[float] = None
    peers: Optional[dict] = None  # name -> {"ms", "ratio"}
    invariant_ms: Optional[float] = None
    graph_ms: Optional[float] = None


def progress(i: int, n: int, label: str, width: int = 28) -> None:
    done = int(width * i / max(n, 1))
    sys.stderr.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {label[:60]:<60}")
    sys.stderr.flush()
    if i == n:
        sys.stderr.write("\n")


def _metrics(row: Row, nbytes: float, flops: float, ceilings: Ceilings) -> None:
    seconds = row.ms / 1e3
    row.gbps = nbytes / seconds / 1e9 if nbytes else None
    row.tflops = flops / seconds / 1e12 if flops else None
    ridge = ceilings.matmul_tflops * 1e12 / (ceilings.copy_tbps * 1e12)  # FLOP per byte
    if flops and nbytes and flops / nbytes > ridge:
        row.bound, row.pct_ceiling = "compute", 100 * row.tflops / ceilings.matmul_tflops
    elif nbytes:
        row.bound, row.pct_ceiling = "memory", 100 * row.gbps / (ceilings.copy_tbps * 1e3)


def _safe_time(fn) -> Optional[float]:
    try:
        return time_ms(fn)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def run_case(case: Case, backend: str, device, ceilings: Ceilings, graphs: bool) -> Row:
    try:
        passed, detail = case.check(device, backend)
    except Exception as exc:  # noqa: BLE001 - a crashing kernel is a failed check, reported
        passed, detail = False, f"{type(exc).__name__}: {exc}"[:300]
    row = Row(case.name, case.op, case.shape, "pass" if passed else "FAIL", detail)
    if not passed or case.build is None:
        return row
    try:
        _time_case(row, case, device, ceilings, graphs)
    except Exception as exc:  # noqa: BLE001 - one broken case must not stop the run
        row.check, row.check_detail = "error", f"timing: {type(exc).__name__}: {exc}"[:300]
        torch.cuda.empty_cache()
    return row


def _time_case(row: Row, case: Case, device, ceilings: Ceilings, graphs: bool) -> None:
    built = case.build(device)
    row.ms = time_ms(built.run)
    _metrics(row, built.bytes, built.flops, ceilings)
    if built.baseline is not None:
        row.baseline_ms = _safe_time(built.baseline)
        row.vs_torch = ratio(row.ms, row.baseline_ms)
    if built.peer_notes:
        row.check_detail = "; ".join([row.check_detail, *built.peer_notes])
    if built.peers:
        row.peers = {}
        for name, fn in built.peers.items():
            peer_ms = _safe_time(fn)
            row.peers[name] = {"ms": peer_ms, "ratio": ratio(row.ms, peer_ms)}
    if case.op in INVARIANT_OPS:
        with batch_invariant_mode():
            row.invariant_ms = time_ms(built.run)
    if graphs and built.graph is not None:  # the case captures its own graph (the model step: the engine's runner)
        row.graph_ms = time_ms(built.graph())
    elif graphs and built.graph_ok and case.op == "dsa_attention":
        row.graph_ms = time_ms_graph(built.run)
    del built
    torch.cuda.empty_cache()


def run_bench(cases: list[Case], backend: str, graphs: bool = True,
              on_row: Optional[Callable[[Ceilings, Row], None]] = None) -> tuple[Ceilings, list[Row]]:
    """Measure the ceilings, then run every case; ``on_row(ceilings, row)`` as each case finishes.

    A case that raises anywhere (check, build, timing) gets an ``error`` row and the run goes on."""
    device = torch.device("cuda")
    progress(0, len(cases) + 1, "ceilings (copy, bf16 matmul)")
    ceilings = measure_ceilings(device)
    rows = []
    for i, case in enumerate(cases, start=1):
        progress(i, len(cases) + 1, f"{case.name} {case.shape}")
        try:
            row = run_case(case, backend, device, ceilings, graphs)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the other cases still run
            row = Row(case.name, case.op, case.shape, "error", f"{type(exc).__name__}: {exc}"[:300])
            torch.cuda.empty_cache()
        rows.append(row)
        if on_row is not None:
            clear_progress()
            on_row(ceilings, row)
    progress(len(cases) + 1, len(cases) + 1, "done")
    return ceilings, rows


def clear_progress() -> None:
    """Blank the progress bar's line on a terminal, so a row printed now starts at column 0."""
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 100 + "\r")
        sys.stderr.flush()


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def table_header(ceilings: Ceilings) -> list[str]:
    return [
        f"ceilings (this run): copy {ceilings.copy_tbps:.2f} TB/s, bf16 matmul {ceilings.matmul_tflops:.0f} TFLOP/s",
        "",
        "| op | shape | check | ms | GB/s | TFLOP/s | % ceiling | vs torch | peer | inv. ms | graph ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]


def row_line(r: Row, detail: bool = False) -> str:
    """One table row; ``detail``: a check that did not pass carries its reason in the check cell."""
    peer = "; ".join(f"{n} {_fmt(p['ms'])} ms ({_fmt(p['ratio'], '.2f')}x)" for n, p in (r.peers or {}).items())
    pct = "-" if r.pct_ceiling is None else f"{r.pct_ceiling:.0f}% {r.bound}"
    check = f"{r.check}: {r.check_detail[:160]}" if detail and r.check != "pass" else r.check
    return (f"| {r.name} | {r.shape} | {check} | {_fmt(r.ms)} | {_fmt(r.gbps, '.0f')} | {_fmt(r.tflops, '.1f')} | "
            f"{pct} | {_fmt(r.vs_torch, '.1f')}x | {peer or '-'} | {_fmt(r.invariant_ms)} | {_fmt(r.graph_ms)} |")


def table(ceilings: Ceilings, rows: list[Row]) -> str:
    lines = table_header(ceilings)
    for r in rows:
        lines.append(row_line(r))
    failed = [r for r in rows if r.check != "pass"]
    for r in failed:
        lines.append(f"\nFAILED {r.name} {r.shape}: {r.check_detail}")
    lines.append("")
    lines.extend(f"check {r.name} {r.shape}: {r.check_detail}" for r in rows)
    return "\n".join(lines)


def environment(backend: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    info = {"backend": backend, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    for package in ("torch", "triton", "fla-core"):
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = None
    return info


def write_json(path: str, backend: str, ceilings: Ceilings, rows: list[Row]) -> None:
    with open(path, "w") as f:
        json.dump({"environment": environment(backend), "ceilings": asdict(ceilings),
                   "rows": [asdict(r) for r in rows]}, f, indent=1)


def plot_roofline(path: str, ceilings: Ceilings, rows: list[Row]) -> str:
    """Write a roofline PNG; returns a message (matplotlib is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(8, 5.5))
    peak_flops, peak_bw = ceilings.matmul_tflops * 1e12, ceilings.copy_tbps * 1e12
    xs = [10 ** (i / 20) for i in range(-40, 81)]
    ax.loglog(xs, [min(peak_flops, x * peak_bw) / 1e12 for x in xs], "k-", label="measured roofline")
    for r in rows:
        if r.ms is None or not r.gbps:
            continue
        intensity = (r.tflops or 0) * 1e12 / (r.gbps * 1e9) if r.tflops else 0.05
        perf = r.tflops if r.tflops else r.gbps * 1e9 * intensity / 1e12
        ax.loglog([intensity], [perf], "o")
        ax.annotate(f"{r.name} {r.shape}", (intensity, perf), fontsize=6)
    ax.set_xlabel("FLOP per byte moved (memory-only ops placed at 0.05)")
    ax.set_ylabel("TFLOP/s (memory-only ops: bytes/s x 0.05)")
    ax.set_title(f"dsahal bench roofline (copy {ceilings.copy_tbps:.2f} TB/s, bf16 {ceilings.matmul_tflops:.0f} TFLOP/s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return f"roofline written to {path}"
