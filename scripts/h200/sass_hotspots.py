"""Where a kernel's warps wait, by SASS instruction: reads Nsight Compute's source page as CSV
(``ncu --import REPORT --page source --csv --print-source sass``) and prints the instructions with the most warp
stall samples (their share of all samples, the stall reasons sampled there), then the samples summed by opcode.

    python3 scripts/h200/sass_hotspots.py SASS.csv [--top 40]

The column names differ between Nsight Compute releases: the sample column is the first whose name holds
"Warp Stall Sampling (All", the reasons every numeric column whose name holds "stall" (case aside).
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv_path")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    with open(args.csv_path, newline="") as f:
        lines = [line for line in f if line.strip()]
    # (ncu may print lines before the header: the header is the first line naming the source column)
    start = next((i for i, line in enumerate(lines) if '"Source"' in line or line.startswith("Source")), 0)
    rows = list(csv.DictReader(lines[start:]))
    if not rows:
        print("error: no rows in the source page", file=sys.stderr)
        return 1
    names = list(rows[0].keys())
    sample = next((n for n in names if "Warp Stall Sampling (All" in n), None) \
        or next((n for n in names if "Sampling" in n), None)
    if sample is None:
        print(f"error: no stall-sampling column among {names}", file=sys.stderr)
        return 1
    # (each reason's "(Not Issued)" twin left out: it repeats the reason's name)
    reasons = [n for n in names if "stall" in n.lower() and "Sampling" not in n and "Not Issued" not in n]
    executed = next((n for n in names if n.startswith("Instructions Executed")), None)
    total = sum(number(r[sample]) for r in rows) or 1.0
    print(f"{len(rows)} SASS lines, {total:.0f} samples ({sample}); columns: {names}")
    by_op = defaultdict(float)
    for r in rows:
        text = re.sub(r"^@!?U?P[T0-9]+\s+", "", r.get("Source", "").strip())  # (a predicate guard)
        op = re.split(r"[\s.]", text, maxsplit=1)[0]
        by_op[op] += number(r[sample])
    ranked = sorted(rows, key=lambda r: -number(r[sample]))[: args.top]
    for r in ranked:
        share = 100 * number(r[sample]) / total
        why = ", ".join(f"{n.split('(')[0].strip()} {number(r[n]):.0f}" for n in reasons if number(r[n]) > 0)
        ran = f" ran {number(r[executed]):.0f}" if executed else ""
        print(f"{share:5.1f}%  {r.get('Address', '?'):>6}  {r.get('Source', '').strip()[:70]:<70}{ran}  {why}")
    print("\nsamples by opcode:")
    for op, count in sorted(by_op.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {100 * count / total:5.1f}%  {op}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
