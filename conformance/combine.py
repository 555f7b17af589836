"""Combine conformance runs: a later run of some op families supersedes those families of an earlier
run (a fix re-certified on scarce hardware without re-running the whole suite)::

    python -m dsahal.conformance.combine EARLIER.json:COMMIT LATER.json:COMMIT ... --out DIR

Every op family is taken whole from the *last* run that tested it; the markdown names, per family,
the run (and commit) it comes from, so a reader can check that nothing in between touched the others.
All runs must be of the same backend with the same settings apart from ``ops``, ``jobs`` and ``seed`` (each
run draws its own examples; the markdown names each family's seed). An error (a missing or unreadable report,
runs that differ) is one ``error:`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from . import report

IGNORED_SETTINGS = ("ops", "jobs", "seed")  # per run: which families it tested, its processes, its draw


def combine(runs: Sequence[tuple[dict, str]]) -> tuple[list[report.TestRecord], dict, dict, list[str]]:
    """``runs``: (payload of ``conformance.json``, label) in run order.

    Returns (records, backend, settings, notes); raises ``ValueError`` when the runs differ in
    backend or settings."""
    if not runs:
        raise ValueError("dsahal.conformance.combine: argument 'runs' expected at least one report, got none")
    first, _ = runs[0]
    name = first["backend"].get("name")
    base = {k: v for k, v in first["settings"].items() if k not in IGNORED_SETTINGS}
    source: dict[str, str] = {}
    by_op: dict[str, list[report.TestRecord]] = {}
    for payload, label in runs:
        if payload["backend"].get("name") != name:
            raise ValueError(f"dsahal.conformance.combine: report {label!r} expected backend {name!r}, "
                             f"got {payload['backend'].get('name')!r}")
        settings = {k: v for k, v in payload["settings"].items() if k not in IGNORED_SETTINGS}
        if settings != base:
            raise ValueError(f"dsahal.conformance.combine: report {label!r} expected settings {base}, got {settings}")
        records = report.records_from(payload)
        seed = payload["settings"].get("seed")
        for op in {r.op for r in records}:
            by_op[op] = [r for r in records if r.op == op]
            source[op] = label if seed is None else f"{label} (seed {seed})"
    records = [r for op in by_op for r in by_op[op]]
    notes = ["Combined from several runs; each op family comes whole from the last run that tested it:", ""]
    notes += [f"- `{op}`: {source[op]}" for op in sorted(source)]
    seeds = [payload["settings"].get("seed") for payload, _ in runs]
    settings = {**base, "seed": seeds[0] if len(set(map(repr, seeds))) == 1 else seeds, "ops": "combined",
                "runs": len(runs)}
    return records, runs[-1][0]["backend"], settings, notes


class _OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one ``error:`` line and status 2 (argparse prints its usage block first)."""

    def error(self, message: str):  # noqa: D401 - argparse's hook; never returns
        self.exit(2, f"error: {self.prog}: {message} (see '{self.prog} --help')\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _OneLineErrors(prog="python -m dsahal.conformance.combine", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", help="conformance.json[:LABEL] in run order (LABEL: commit, date)")
    parser.add_argument("--out", required=True, help="directory for the combined conformance.json and .md")
    args = parser.parse_args(argv)
    try:
        runs = []
        for spec in args.reports:
            path, _, label = spec.partition(":")
            runs.append((report.read_json(Path(path)), label or path))
        records, backend, settings, notes = combine(runs)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a report missing, not JSON, or not a report
        own = isinstance(exc, ValueError) and str(exc).startswith("dsahal.")  # combine()'s own message
        print(f"error: {exc}" if own else f"error: dsahal.conformance.combine: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from dsahal.ops import OP_NAMES

    # the runs' own versions (the machine combining them may have none of that software)
    report.write_json(out / "conformance.json", records, backend, settings,
                      {"versions": runs[-1][0].get("versions", {}), "combined_from": [label for _, label in runs]})
    report.write_markdown(out / "conformance.md", records, backend, settings, OP_NAMES, notes)
    print(f"{len(records)} tests from {len(runs)} runs -> {out / 'conformance.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
