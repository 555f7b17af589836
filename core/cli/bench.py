"""``dsahal bench``: every op at the shapes of PERF.md on a GPU backend, after a correctness check, and one
decode step of the whole model (``--op model``), eager and replayed from a CUDA graph.

Each case's row is printed as soon as it finishes; the full table follows at the end."""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time every op at PERF.md's shapes against measured ceilings")
    p.add_argument("--backend", default=None, help="backend to time (default: the selected one)")
    p.add_argument("--op", action="append", default=None, help="only cases of this op (repeatable; 'model': the whole "
                                                                   "model's decode step)")
    p.add_argument("--json", default=None, metavar="F", help="write the results as JSON to F")
    p.add_argument("--plot", default=None, metavar="F.png", help="write a roofline plot (needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="reduced shapes (a smoke run)")
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


def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("error: dsahal bench needs a CUDA/ROCm device visible to torch; none is", file=sys.stderr)
        return 2
    from ..bench.cases import all_cases
    from ..bench.report import plot_roofline, run_bench, table, write_json
    from ..registry import active_table, set_backend

    table_ = set_backend(args.backend) if args.backend else active_table()
    backend = table_.name
    cases = select_cases(all_cases(quick=args.quick), args.op)
    if not cases:
        print(f"error: no bench case for op(s) {args.op}", file=sys.stderr)
        return 2
    ceilings, rows = run_bench(cases, backend, graphs=not args.no_graphs, on_row=RowPrinter())
    print("\nall cases:", flush=True)
    print(table(ceilings, rows))
    if args.json:
        write_json(args.json, backend, ceilings, rows)
        print(f"json written to {args.json}")
    if args.plot:
        print(plot_roofline(args.plot, ceilings, rows))
    return 0 if all(r.check == "pass" for r in rows) else 1
