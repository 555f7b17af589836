"""``dsahal bench``: every op at the shapes of docs/performance.md on a GPU backend, after a correctness
check, and one decode step of the whole model (``--op model``), eager and replayed from a CUDA graph.

The full bench is GPU-only (CUDA or ROCm). ``--quick`` runs the same harness on the CPU at tiny shapes
(:mod:`dsahal.bench.quick`), by default against the reference backend: a test of the bench path that runs
in CI, not a measurement.

Each case's row is printed as soon as it finishes; the full table follows at the end."""
from __future__ import annotations

import argparse
import sys

from . import check_output_path

HELP = "time every op at docs/performance.md's shapes on a GPU (--quick: tiny shapes on the CPU)"
DESCRIPTION = """\
Time every op at the shapes of docs/performance.md against the copy and matmul ceilings measured in the
same process, after checking each op against the reference on fresh random inputs. GPU-only: it needs a
CUDA or ROCm device visible to torch.

--quick runs the same harness on the CPU at tiny shapes (default backend: reference), checking each op
against the reference and printing host wall-clock times. It tests the bench path (CI runs it); its
times are not a measurement. Exit status: 0 when every check passed, 1 when one failed, 2 on a usage
error."""


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help=HELP, description=DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default=None,
                   help="backend to time (default: the selected one; with --quick: reference)")
    p.add_argument("--op", action="append", default=None,
                   help="only cases of this op (repeatable; 'model': the whole model's decode step, GPU only)")
    p.add_argument("--json", default=None, metavar="F", help="write the results as JSON to F")
    p.add_argument("--plot", default=None, metavar="F.png", help="write a roofline plot (needs matplotlib; GPU only)")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes on the CPU, checked against the reference (runs without a GPU)")
    p.add_argument("--section", action="append", default=None, metavar="NAME",
                   help="with --quick: only this section (repeatable; default: all, see dsahal.bench.quick)")
    p.add_argument("--reduced", action="store_true", help="the GPU cases at reduced shapes (a shorter GPU run)")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph replay timing")
    p.set_defaults(func=run)


class RowPrinter:
    """Prints each case's row as it finishes (the header before the first), flushed: a long run shows
    its results as they come, and a run cut short keeps the rows it reached."""

    def __init__(self, out=None):
        self.out, self.started = out, False

    def __call__(self, ceilings, row) -> None:
        from ..bench.report import row_line, table_header

        out = self.out or sys.stdout
        if not self.started:
            self.started = True
            print("\n".join(table_header(ceilings)), file=out)
        print(row_line(row, detail=True), file=out, flush=True)


def select_cases(cases: list, ops: list[str] | None) -> list:
    """The cases of ``ops`` (all when None), in the order the ops were asked for: a run that may be
    cut short (a time limit on a borrowed GPU) reaches the rows that matter most first."""
    if not ops:
        return list(cases)
    return sorted((c for c in cases if c.op in ops), key=lambda case: ops.index(case.op))


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def run(args) -> int:
    if args.json:  # the report is written after the run: a bad path must not cost it (GPU bench and --quick)
        try:
            check_output_path(args.json)
        except ValueError as exc:
            return _error(f"dsahal bench: argument '--json': {exc}")
    if args.quick:
        return run_quick(args)
    if args.section:
        return _error("dsahal bench: argument '--section' selects sections of --quick; give --quick with it")
    import torch

    if not torch.cuda.is_available():
        return _error("dsahal bench needs a CUDA/ROCm device visible to torch, and torch sees none "
                      f"(torch {torch.__version__}); `dsahal bench --quick` runs the bench path on the CPU "
                      "at tiny shapes")
    from ..bench.cases import all_cases
    from ..bench.report import plot_roofline, run_bench, table, write_json
    from ..registry import active_table, set_backend

    table_ = set_backend(args.backend) if args.backend else active_table()
    backend = table_.name
    cases = select_cases(all_cases(quick=args.reduced), args.op)
    if not cases:
        return _error(f"dsahal bench: argument '--op' expected op names with a bench case, got {args.op}")
    ceilings, rows = run_bench(cases, backend, graphs=not args.no_graphs, on_row=RowPrinter())
    print("\nall cases:", flush=True)
    print(table(ceilings, rows))
    if args.json:
        write_json(args.json, backend, ceilings, rows)
        print(f"json written to {args.json}")
    if args.plot:
        print(plot_roofline(args.plot, ceilings, rows))
    return 0 if all(r.check == "pass" for r in rows) else 1


def run_quick(args) -> int:
    """``--quick``: :mod:`dsahal.bench.quick`'s sections on the CPU; rows print as they finish."""
    import json

    from ..bench.quick import SECTIONS, quick_header, quick_row_line, run_quick as run_sections, section_ops
    from ..registry import RegistryError, active_table, use_backend
    from ..registry.settings import SettingError

    if args.plot or args.reduced or args.no_graphs:
        flag = "--plot" if args.plot else "--reduced" if args.reduced else "--no-graphs"
        return _error(f"dsahal bench: argument '{flag}' applies to the GPU bench, not to --quick")
    unknown = sorted(set(args.section or ()) - set(SECTIONS))
    if unknown:
        return _error(f"dsahal bench: argument '--section' expected one of {', '.join(SECTIONS)}, "
                      f"got {', '.join(unknown)}")
    covered = section_ops()
    quick_ops = covered["ops"]
    bad_ops = sorted(set(args.op or ()) - quick_ops)
    if bad_ops:
        return _error(f"dsahal bench: argument '--op' expected ops with a --quick case "
                      f"({', '.join(sorted(quick_ops))}), got {', '.join(bad_ops)}")
    if args.op:  # e.g. --section dispatch --op kda_decode ran nothing and reported "0 of 0 checks passed"
        sections = args.section or list(SECTIONS)
        if not any(set(args.op) & covered[s] for s in sections):
            listing = "; ".join(f"{s}: {', '.join(sorted(covered[s]))}" for s in sections)
            return _error(f"dsahal bench: arguments '--section {' '.join(sections)}' and '--op {' '.join(args.op)}' "
                          f"expected to select at least one case, got none (the sections' ops: {listing})")
    name = args.backend or "reference"
    try:
        with use_backend(name):
            backend = active_table().name  # an unknown or unavailable name fails here, with the registry's reason
    except SettingError as exc:  # a mistyped environment flag: not the argument's fault
        return _error(f"dsahal bench --quick: {exc}")
    except RegistryError as exc:  # its message goes on to list every backend and why each is unavailable
        return _error(f"dsahal bench --quick: argument '--backend': {exc}")
    print("\n".join(quick_header(backend)), flush=True)
    results = run_sections(backend, sections=args.section, ops=args.op,
                           on_row=lambda row: print(quick_row_line(row), flush=True))
    rows = [row for section_rows in results.values() for row in section_rows]
    failed = [r for r in rows if r.check != "pass"]
    for r in failed:
        print(f"FAILED {r.name} {r.shape}: {r.check_detail}")
    print(f"{len(rows) - len(failed)} of {len(rows)} checks passed "
          f"(sections: {', '.join(results)}; CPU wall-clock times, not a measurement)")
    if args.json:
        from dataclasses import asdict

        from ..bench.report import environment

        with open(args.json, "w") as f:
            json.dump({"environment": {**environment(backend), "mode": "quick (CPU, tiny shapes)"}, "ceilings": None,
                       "sections": {s: [asdict(r) for r in rs] for s, rs in results.items()}}, f, indent=1)
        print(f"json written to {args.json}")
    return 0 if not failed else 1
