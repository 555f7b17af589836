"""Reports of a conformance run: a JSON record per test and a markdown matrix op × format × outcome.
(JUnit XML comes from pytest's own ``--junitxml``.)"""
from __future__ import annotations

import json
import platform
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

OUTCOMES = ("pass", "fail", "skip", "fallback", "xfail", "xpass")


@dataclass
class TestRecord:
    id: str
    nodeid: str
    op: str
    property: str
    format: str
    backend: str
    outcome: str = "pass"
    examples: int = 0
    native_examples: int = 0
    fallback_examples: int = 0
    duration_s: float = 0.0
    message: str = ""


def _versions() -> dict:
    import hypothesis
    import torch

    from dsahal import __version__

    return {"dsahal": __version__, "torch": torch.__version__, "hypothesis": hypothesis.__version__,
            "python": platform.python_version(), "machine": platform.machine()}


def summary(records: list[TestRecord]) -> dict:
    counts = {o: 0 for o in OUTCOMES}
    for r in records:
        counts[r.outcome] += 1
    return counts


def matrix(records: list[TestRecord]) -> dict:
    """``{op: {format: {outcome: count}}}``."""
    table: dict = defaultdict(lambda: defaultdict(lambda: {o: 0 for o in OUTCOMES}))
    for r in records:
        table[r.op][r.format][r.outcome] += 1
    return table


def cell_status(counts: dict) -> str:
    """One word for a matrix cell: any fail wins, then pass, then fallback, then skip."""
    if counts["fail"] or counts["xpass"]:
        return "fail"
    if counts["pass"]:
        return "pass"
    if counts["fallback"]:
        return "fallback"
    if counts["xfail"]:
        return "xfail"
    return "skip"


def write_json(path: Path, records: list[TestRecord], backend: dict, settings: dict) -> None:
    payload = {"backend": backend, "settings": settings, "versions": _versions(), "summary": summary(records),
               "matrix": {op: {fmt: dict(c) for fmt, c in fmts.items()} for op, fmts in matrix(records).items()},
               "tests": [asdict(r) for r in records]}
    path.write_text(json.dumps(payload, indent=2, sort_keys=False))


def _provenance(backend: dict) -> list[str]:
    """Where this run happened and what was never verified: the probe's own words, versions, and the
    backend's declared unverified paths (so a report can say "Triton paths on NVIDIA hardware")."""
    lines = []
    if backend.get("reason"):
        lines.append(f"Device (probe): {backend['reason']}")
    versions = backend.get("versions") or {}
    if versions:
        lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    unverified = (backend.get("capabilities") or {}).get("unverified") or {}
    lines += [f"- unverified on hardware: `{op}`: {why}" for op, why in unverified.items()]
    return lines + [""] if lines else []


def render_markdown(records: list[TestRecord], backend: dict, settings: dict, op_order) -> str:
    counts = summary(records)
    lines = [f"# dsahal conformance: backend `{backend.get('name')}`", "",
             f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip, {counts['fallback']} fallback"
             + (f", {counts['xfail']} xfail" if counts["xfail"] else "")
             + (f", {counts['xpass']} xpass" if counts["xpass"] else ""),
             "", f"Settings: {', '.join(f'{k}={v}' for k, v in settings.items())}", "",
             *_provenance(backend),
             "| op | format | status | pass | fail | skip | fallback | examples native / fallback |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    table = matrix(records)
    examples: dict = defaultdict(lambda: [0, 0])
    for r in records:
        examples[(r.op, r.format)][0] += r.native_examples
        examples[(r.op, r.format)][1] += r.fallback_examples
    ordered = [op for op in op_order if op in table] + sorted(set(table) - set(op_order))
    for op in ordered:
        for fmt in sorted(table[op]):
            c = table[op][fmt]
            native, fallback = examples[(op, fmt)]
            lines.append(f"| {op} | {fmt} | **{cell_status(c)}** | {c['pass']} | {c['fail'] + c['xpass']} | "
                         f"{c['skip'] + c['xfail']} | {c['fallback']} | {native} / {fallback} |")
    failures = [r for r in records if r.outcome in ("fail", "xpass")]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            lines += [f"### `{r.id}` ({r.property})", "", "```", r.message.strip()[:4000], "```", ""]
    not_run = [r for r in records if r.outcome in ("skip", "fallback", "xfail")]
    if not_run:
        lines += ["", "## Not counted as passes", "", "| test | outcome | reason |", "| --- | --- | --- |"]
        for r in not_run:
            reason = r.message.strip().splitlines()[0] if r.message.strip() else ""
            lines.append(f"| `{r.id}` | {r.outcome} | {reason.replace('|', '/')[:200]} |")
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, records, backend, settings, op_order) -> None:
    path.write_text(render_markdown(records, backend, settings, op_order))
