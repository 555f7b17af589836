"""Reports of a conformance run: a JSON record per test and a markdown matrix op × format × outcome.
(JUnit XML comes from pytest's own ``--junitxml``.) ``merge`` and ``merge_junit`` combine the reports
of runs over disjoint sets of tests (``dsahal conformance --jobs N``) into those of one run."""
from __future__ import annotations

import json
import platform
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

# "incomplete": the test was set up but its body never reported (the run was interrupted or timed out
# inside it); it is never a pass.
OUTCOMES = ("pass", "fail", "skip", "fallback", "xfail", "xpass", "incomplete")


@dataclass
class TestRecord:
    id: str
    nodeid: str
    op: str
    property: str
    format: str
    backend: str
    outcome: str = "incomplete"  # until the test body reports
    examples: int = 0
    native_examples: int = 0
    fallback_examples: int = 0
    duration_s: float = 0.0
    message: str = ""
    routes: dict = field(default_factory=dict)  # "op:route" -> examples it served


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


def op_cells(formats: dict) -> str:
    """An op's matrix row as the terminal summary prints it: ``latent:bf16=pass, latent:fp8=fail``, or the
    status alone for an op without cache formats (format ``-``), not ``-=pass``."""
    if set(formats) == {"-"}:
        return cell_status(formats["-"])
    return ", ".join(f"{fmt}={cell_status(c)}" for fmt, c in sorted(formats.items()))


def cell_status(counts: dict) -> str:
    """One word for a matrix cell: any fail wins, then incomplete, then pass, then fallback, then skip."""
    if counts["fail"] or counts["xpass"]:
        return "fail"
    if counts.get("incomplete"):
        return "incomplete"
    if counts["pass"]:
        return "pass"
    if counts["fallback"]:
        return "fallback"
    if counts["xfail"]:
        return "xfail"
    return "skip"


def write_json(path: Path, records: list[TestRecord], backend: dict, settings: dict,
               extra: dict | None = None) -> None:
    """``extra``: further top-level keys (a merged run adds ``merge``: its parts and any problem)."""
    payload = {"backend": backend, "settings": settings, "versions": _versions(), "summary": summary(records),
               "matrix": {op: {fmt: dict(c) for fmt, c in fmts.items()} for op, fmts in matrix(records).items()},
               "tests": [asdict(r) for r in records], **(extra or {})}
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


def render_markdown(records: list[TestRecord], backend: dict, settings: dict, op_order,
                    notes: Sequence[str] = ()) -> str:
    """``notes``: markdown lines shown under the settings (a merged run lists its parts there)."""
    counts = summary(records)
    lines = [f"# dsahal conformance: backend `{backend.get('name')}`", "",
             f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip, {counts['fallback']} fallback"
             + (f", {counts['xfail']} xfail" if counts["xfail"] else "")
             + (f", {counts['xpass']} xpass" if counts["xpass"] else "")
             + (f", **{counts['incomplete']} incomplete** (interrupted, not certified)" if counts["incomplete"] else ""),
             "", f"Settings: {', '.join(f'{k}={v}' for k, v in settings.items())}", "",
             *([*notes, ""] if notes else []),
             *_provenance(backend),
             "| op | format | status | pass | fail | skip | fallback | examples native / fallback | routes (examples) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    table = matrix(records)
    examples: dict = defaultdict(lambda: [0, 0])
    served: dict = defaultdict(lambda: defaultdict(int))
    for r in records:
        examples[(r.op, r.format)][0] += r.native_examples
        examples[(r.op, r.format)][1] += r.fallback_examples
        for route, n in (r.routes or {}).items():
            served[(r.op, r.format)][route] += n
    ordered = [op for op in op_order if op in table] + sorted(set(table) - set(op_order))
    for op in ordered:
        for fmt in sorted(table[op]):
            c = table[op][fmt]
            native, fallback = examples[(op, fmt)]
            routes = ", ".join(f"{name} {n}" for name, n in sorted(served[(op, fmt)].items())) or "-"
            lines.append(f"| {op} | {fmt} | **{cell_status(c)}** | {c['pass']} | {c['fail'] + c['xpass']} | "
                         f"{c['skip'] + c['xfail']} | {c['fallback']} | {native} / {fallback} | {routes} |")
    failures = [r for r in records if r.outcome in ("fail", "xpass")]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            lines += [f"### `{r.id}` ({r.property})", "", "```", r.message.strip()[:4000], "```", ""]
    not_run = [r for r in records if r.outcome in ("skip", "fallback", "xfail", "incomplete")]
    if not_run:
        lines += ["", "## Not counted as passes", "", "| test | outcome | reason |", "| --- | --- | --- |"]
        for r in not_run:
            reason = r.message.strip().splitlines()[0] if r.message.strip() else ""
            lines.append(f"| `{r.id}` | {r.outcome} | {reason.replace('|', '/')[:200]} |")
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, records, backend, settings, op_order, notes: Sequence[str] = ()) -> None:
    path.write_text(render_markdown(records, backend, settings, op_order, notes))


# --- merging the reports of parts (``dsahal conformance --jobs N``) ---------------------------------


@dataclass
class MergedRun:
    """The parts' records as one run's; ``problems``: where the parts disagree (backend or settings),
    which makes the merged run invalid: its parts did not certify one and the same thing."""

    records: list[TestRecord]
    backend: dict
    settings: dict
    problems: list[str] = field(default_factory=list)


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def records_from(payload: dict) -> list[TestRecord]:
    return [TestRecord(**test) for test in payload.get("tests", [])]


def _short(value, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _disagreements(what: str, by_part: Mapping[str, dict]) -> list[str]:
    """One line per key whose value is not the same in every part."""
    lines = []
    keys = list(dict.fromkeys(k for d in by_part.values() for k in d))
    for key in keys:
        values = {label: d.get(key) for label, d in by_part.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            shown = "; ".join(f"{label}: {_short(v)}" for label, v in values.items())
            lines.append(f"{what} {key!r} differs between parts ({shown})")
    return lines


def merge(payloads: Mapping[str, dict], settings: Mapping | None = None) -> MergedRun:
    """Combine the ``conformance.json`` payloads of parts (label -> payload) run over disjoint sets of
    tests into one run's records, backend and settings.

    Records keep the suite's order (by test file, then each part's own order, which is pytest's).
    The backend is the parts' common one; every key on which they differ is a problem, as is any
    setting other than ``ops`` (the union of the parts'). ``settings`` overrides merged values.
    """
    records = sorted((r for p in payloads.values() for r in records_from(p)), key=lambda r: r.nodeid.split("::")[0])
    backends = {label: p.get("backend", {}) for label, p in payloads.items()}
    part_settings = {label: dict(p.get("settings", {})) for label, p in payloads.items()}
    ops = sorted({op for s in part_settings.values() if isinstance(s.get("ops"), list) for op in s["ops"]})
    without_ops = {label: {k: v for k, v in s.items() if k != "ops"} for label, s in part_settings.items()}
    problems = _disagreements("backend", backends) + _disagreements("setting", without_ops)
    merged = dict(next(iter(part_settings.values()), {}))
    merged["ops"] = ops or "all"
    merged.update(settings or {})
    return MergedRun(records, next(iter(backends.values()), {}), merged, problems)


def _junit_suites(path: Path) -> list[ET.Element]:
    root = ET.parse(path).getroot()
    return [root] if root.tag == "testsuite" else root.findall("testsuite")


def _failure_suite(failures: Sequence[TestRecord]) -> ET.Element:
    """A <testsuite> for records no part could report itself: a <failure> for each failing one (a part
    that crashed), an <error> for each other (an "incomplete" test of a part that was stopped)."""
    errors = sum(record.outcome != "fail" for record in failures)
    suite = ET.Element("testsuite", name="dsahal conformance parts", errors=str(errors),
                       failures=str(len(failures) - errors), skipped="0", tests=str(len(failures)), time="0")
    for record in failures:
        case = ET.SubElement(suite, "testcase", classname=record.op, name=record.id, time="0")
        tag = "failure" if record.outcome == "fail" else "error"
        failure = ET.SubElement(case, tag, message=record.message.splitlines()[0] if record.message else "")
        failure.text = record.message
    return suite


def merge_junit(sources: Mapping[str, Path], out: Path, failures: Sequence[TestRecord] = ()) -> list[str]:
    """Write one xunit2 file: a <testsuites> holding each part's <testsuite> (renamed "<name> <label>")
    and, for ``failures`` (records no part wrote: failing or incomplete), one more suite. Returns the
    labels whose file was missing or unreadable."""
    root = ET.Element("testsuites", name="dsahal conformance")
    unreadable = []
    for label, path in sources.items():
        try:
            suites = _junit_suites(path)
        except (OSError, ET.ParseError):
            unreadable.append(label)
            continue
        for suite in suites:
            suite.set("name", f"{suite.get('name', 'pytest')} {label}")
            root.append(suite)
    if failures:
        root.append(_failure_suite(failures))
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, 0)) for s in root)))
    root.set("time", f"{sum(float(s.get('time', 0)) for s in root):.3f}")
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
    return unreadable
