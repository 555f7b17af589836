"""``dsahal bench``: every op at the shapes of PERF.md on a GPU backend, after a correctness check."""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time every op at PERF.md's shapes against measured ceilings")
    p.add_argument("--backend", default=None, help="backend to time (default: the selected one)")
    p.add_argument("--op", action="append", default=None, help="only cases of this op (repeatable)")
    p.add_argument("--json", default=None, metavar="F", help="write the results as JSON to F")
    p.add_argument("--plot", default=None, metavar="F.png", help="write a roofline plot (needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="reduced shapes (a smoke run)")
    p.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph replay timing")
    p.set_defaults(func=run)


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
    cases = [c for c in all_cases(quick=args.quick) if not args.op or c.op in args.op]
    if not cases:
        print(f"error: no bench case for op(s) {args.op}", file=sys.stderr)
        return 2
    ceilings, rows = run_bench(cases, backend, graphs=not args.no_graphs)
    print(table(ceilings, rows))
    if args.json:
        write_json(args.json, backend, ceilings, rows)
        print(f"json written to {args.json}")
    if args.plot:
        print(plot_roofline(args.plot, ceilings, rows))
    return 0 if all(r.check == "pass" for r in rows) else 1
