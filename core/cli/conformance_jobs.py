"""``dsahal conformance --jobs N``: the suite split by op family over N child processes, whose reports
are merged into those of one run.

Why: on a GPU most of the suite's time is Triton compiling a kernel for each shape specialisation,
which is CPU-bound, and one process keeps one core busy. Op families are independent (each property
draws its own inputs), so groups of them can run side by side and their reports be concatenated.

Each child is ``python -m dsahal conformance ... --ops <group> --report-dir <D>/parts/<i>`` with every
other option passed through and one seed drawn here for all. Its output goes to ``parts/<i>/log.txt``;
one line is printed as each child finishes, then the logs of the children that failed, then the
merged summary. ``<D>`` gets the merged conformance.json, conformance.md and junit.xml.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..ops.catalog import COLLECTIVE_OPS, OP_NAMES

# Relative cost of an op family's properties on a GPU (roughly: tests x kernels compiled per test).
# Only the balance between groups depends on it; an op missing here gets DEFAULT_WEIGHT.
OP_WEIGHTS = {
    "cache_write": 20.0,  # 3 properties x 7 latent/index formats
    "sparse_mla": 24.0,  # 5 properties x latent formats, split-K and lse variants
    "dsa_attention": 20.0,  # composite: indexer + top-k + sparse MLA per format pair
    "kda_prefill": 12.0,  # fla-core chunk kernels: many specialisations
    "indexer_score": 9.0,
    "kda_decode": 6.0,
    "topk": 3.0,
    "topk_merge": 2.0,
    "all_gather": 1.0,
    "all_to_all": 1.0,
    "positions_to_slots": 1.0,
    "lse_combine": 1.0,
}
DEFAULT_WEIGHT = 5.0
# The collectives run on a pool of gloo ranks that each process starts once (spawn + torch import):
# they stay in one group so that only one child pays for it, and the group carries that cost.
RANK_POOL_STARTUP_WEIGHT = 3.0
POLL_S = 0.1
LOG_TAIL_LINES = 300
STOP_GRACE_S = 15.0  # for a stopped child to write its partial reports (a Triton compile is not interruptible)


class Terminated(Exception):
    """SIGTERM or SIGHUP reached the parent (``timeout``, a CI cancel): stop the children and merge."""


def ops_with_tests(suite_dir: Path) -> list[str]:
    """The op families the suite has properties for (in OP_NAMES order): a child given an op
    without any would select no test and fail as a usage error."""
    pattern = re.compile(r"""conformance_property\(\s*["']([a-z_0-9]+)["']""")
    found = {m.group(1) for path in suite_dir.glob("test_*.py") for m in pattern.finditer(path.read_text())}
    return [op for op in OP_NAMES if op in found]


def _units(ops: list[str]) -> list[tuple[list[str], float]]:
    """Indivisible groups of ops with their weight: every op alone, except the collectives together."""
    collectives = [op for op in ops if op in COLLECTIVE_OPS]
    units = [([op], OP_WEIGHTS.get(op, DEFAULT_WEIGHT)) for op in ops if op not in COLLECTIVE_OPS]
    if collectives:
        weight = RANK_POOL_STARTUP_WEIGHT + sum(OP_WEIGHTS.get(op, DEFAULT_WEIGHT) for op in collectives)
        units.append((collectives, weight))
    return units


def split_ops(ops: list[str], jobs: int) -> list[list[str]]:
    """At most ``jobs`` non-empty groups of ``ops`` with balanced weight (heaviest unit first into the
    lightest group); each group lists its ops in OP_NAMES order, groups heaviest first."""
    order = {op: i for i, op in enumerate(OP_NAMES)}

    def rank(op_list: list[str]) -> int:  # ties are broken by the catalog's order, not by the caller's
        return min(order.get(op, len(order)) for op in op_list)

    units = sorted(_units(ops), key=lambda unit: (-unit[1], rank(unit[0])))
    groups: list[tuple[float, list[str]]] = [(0.0, []) for _ in range(min(jobs, len(units)))]
    for unit_ops, weight in units:
        lightest = min(range(len(groups)), key=lambda i: groups[i][0])
        load, members = groups[lightest]
        groups[lightest] = (load + weight, members + unit_ops)
    groups.sort(key=lambda group: (-group[0], rank(group[1])))
    return [sorted(members, key=lambda op: order.get(op, len(order))) for _, members in groups]


@dataclass
class Part:
    """One child run: its ops, report directory, process and what it left behind."""

    index: int
    ops: list[str]
    dir: Path
    command: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    returncode: int | None = None
    stopped: str = ""  # why we ended it before it finished (-x, Ctrl-C, SIGTERM)
    payload: dict | None = None
    read_error: str = ""

    @property
    def label(self) -> str:
        return f"part {self.index}"

    @property
    def log(self) -> Path:
        return self.dir / "log.txt"

    @property
    def status(self) -> str:
        """ok | failed (tests failed) | empty (no test selected) | usage | stopped | crashed."""
        code, tests = self.returncode, (self.payload or {}).get("tests")
        if self.stopped:
            return "stopped"
        if code == 0 and self.payload is not None:
            return "ok"
        if code == 1 and self.payload is not None:
            return "failed"
        if code == 2:
            # The CLI exits 2 both when -k left this group nothing (a report with no test) and on a
            # usage error (bad backend, skip file), which stops it before any report is written.
            return "empty" if self.payload is not None and not tests else "usage"
        return "crashed"

    def describe_exit(self) -> str:
        code = self.returncode
        if code is None:
            return "was not started" if self.process is None else "has not finished"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"


def child_command(args, ops: list[str], report_dir: Path, seed: int | None) -> list[str]:
    """``python -m dsahal conformance`` for one group: every option of ours except --jobs, --ops and
    --report-dir passed through unchanged."""
    command = [sys.executable, "-m", "dsahal", "conformance", "--ops", *ops, "--report-dir", str(report_dir)]
    valued = (("--backend", args.backend), ("--skips", args.skips), ("--xfails", args.xfails),
              ("--max-examples", args.max_examples), ("--seed", seed), ("--device", args.device), ("-k", args.k))
    for flag, value in valued:
        if value is not None:
            command += [flag, str(value)]
    for flag, on in (("--derandomize", args.derandomize), ("--exitfirst", args.exitfirst),
                     ("--verbose", args.verbose)):
        if on:
            command.append(flag)
    return command


def child_env(jobs: int) -> dict:
    """The environment passes through (DSAHAL_* selects paths); only defaults the user left unset
    are added: threads shared between the children rather than each taking every core, unbuffered
    output and the fault handler so that a child that dies still leaves its last lines in its log."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def launch(part: Part, env: dict) -> None:
    part.dir.mkdir(parents=True, exist_ok=True)
    # Own process group (same session, so whoever ends our session ends them too): stopping or
    # reaping a child reaches the gloo ranks it spawned, and nothing else.
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    with part.log.open("wb") as log:
        part.process = subprocess.Popen(part.command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, **group)
    part.started = time.monotonic()


def _signal_group(part: Part, sig: int) -> None:
    try:
        os.killpg(part.process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all(parts: list[Part], why: str) -> None:
    """End running children: SIGINT first, on which pytest still runs its session end and so writes
    the reports of the properties done so far; SIGKILL for those not gone after a grace period."""
    for part in parts:
        part.stopped = why
        if part.process is not None:
            _signal_group(part, signal.SIGINT)
    deadline = time.monotonic() + STOP_GRACE_S
    for part in [p for p in parts if p.process is not None]:
        try:
            part.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(part, signal.SIGKILL)
            part.process.wait()
        collect(part)
        if part.returncode == 0:
            part.stopped = ""  # it had finished its run on its own, only not yet been polled


def collect(part: Part) -> None:
    """Record a finished child's exit and read its report (absent when it died before writing it)."""
    part.returncode = part.process.returncode
    part.seconds = time.monotonic() - part.started
    if part.returncode not in (0, 1, 2) or part.stopped:
        _signal_group(part, signal.SIGKILL)  # a child that died leaves its gloo ranks waiting forever
    path = part.dir / "conformance.json"
    if not path.is_file():
        return
    from dsahal.conformance import report

    try:
        part.payload = report.read_json(path)
    except (OSError, ValueError) as exc:
        part.read_error = f"unreadable conformance.json: {exc}"


def progress_line(part: Part, done: int, total: int) -> str:
    from dsahal.conformance import report

    counts = (part.payload or {}).get("summary") or {}
    shown = ", ".join(f"{counts.get(o, 0)} {o}" for o in report.OUTCOMES
                      if counts.get(o) or o in ("pass", "fail")) if counts else "no report"
    return (f"[{done}/{total}] {part.label} ({', '.join(part.ops)}): {part.status}, {part.describe_exit()} "
            f"after {part.seconds:.1f} s; {shown}; log {part.log}")


def wait_all(parts: list[Part], exitfirst: bool) -> None:
    """Wait for every child, printing a line as each finishes; under -x the first failing child
    stops the others (as a single run stops at its first failure)."""
    running, done = list(parts), 0
    while running:
        finished = [p for p in running if p.process.poll() is not None]
        for part in finished:
            running.remove(part)
            collect(part)
            done += 1
            print(progress_line(part, done, len(parts)), flush=True)
        if exitfirst and running and any(p.status in ("failed", "crashed", "usage") for p in finished):
            print(f"-x: stopping {', '.join(p.label for p in running)} after a part failed", flush=True)
            stop_all(running, "after another part failed (-x)")
            running = []
        time.sleep(POLL_S)


@contextmanager
def terminate_raises():
    """SIGTERM and SIGHUP raise ``Terminated`` (by default they would kill this process alone and
    leave its children running on in their own process groups)."""
    def handler(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def print_log(part: Part, seen: dict[str, str]) -> None:
    """The tail of a failed child's log; a log identical to one already printed is named, not repeated
    (a usage error prints the same message in every child)."""
    text = part.log.read_text(errors="replace") if part.log.is_file() else ""
    print(f"\n===== {part.label} ({', '.join(part.ops)}): {part.status}; log {part.log} =====", flush=True)
    key = re.sub(r"\d+(\.\d+)?s\b", "", text)  # pytest's timings differ between otherwise equal logs
    if key in seen:
        print(f"(same output as {seen[key]})")
        return
    seen[key] = part.label
    lines = text.splitlines()
    if not lines:
        print("(the log is empty: the process died before writing anything)")
    if len(lines) > LOG_TAIL_LINES:
        print(f"... ({len(lines) - LOG_TAIL_LINES} earlier lines in the log)")
    print("\n".join(lines[-LOG_TAIL_LINES:]), flush=True)


def missing_report_message(part: Part) -> str:
    why = part.read_error or "wrote no conformance.json"
    return (f"{part.label} (ops: {', '.join(part.ops)}) {part.describe_exit()} and {why}: "
            f"these ops are NOT certified by this run; log {part.log}")


def failure_records(part: Part) -> list:
    """Failing records for a part that crashed, or exited non-zero with no failing test in its report
    (interrupted, internal error): so the merged JSON, markdown and junit never read as a pass."""
    from dsahal.conformance import report

    if part.status == "crashed":
        message = missing_report_message(part) if part.payload is None else \
            f"{part.label} (ops: {', '.join(part.ops)}) {part.describe_exit()}; log {part.log}"
    elif part.status == "failed" and not any(t["outcome"] in ("fail", "xpass") for t in part.payload["tests"]):
        message = f"{part.label} (ops: {', '.join(part.ops)}) {part.describe_exit()} but reported no failing test"
    else:
        return []
    tail = part.log.read_text(errors="replace").splitlines()[-40:] if part.log.is_file() else []
    full = message + ("\nlast lines of its log:\n" + "\n".join(tail) if tail else "")
    return [report.TestRecord(id=f"parts/{part.index}::{op}", nodeid=f"parts/{part.index}::{op}", op=op,
                              property="run.part_completed", format="-", backend="", outcome="fail",
                              message=full) for op in part.ops]


def part_notes(parts: list[Part], problems: list[str]) -> list[str]:
    """Markdown lines for the merged report: each part, and every problem in bold."""
    notes = [f"Parts (`--jobs {len(parts)}`, in `parts/<i>/`):"]
    notes += [f"- {p.label}: {', '.join(p.ops)}: {p.status}, {p.describe_exit()} after {p.seconds:.0f} s"
              for p in parts]
    notes += [f"- **problem**: {problem}" for problem in problems]
    return notes


def write_merged(parts: list[Part], report_dir: Path, settings: dict, defaults: dict,
                 backend_name: str | None) -> tuple[list, list[str], dict]:
    """Merge the parts' reports into ``report_dir``: ``settings`` override the parts' own, ``defaults``
    stand in where no part left a report. Returns (records, problems, settings)."""
    from dsahal.conformance import report

    merged = report.merge({p.label: p.payload for p in parts if p.payload is not None}, settings)
    merged.settings = {**defaults, **merged.settings}
    extra_failures = [r for p in parts for r in failure_records(p)]
    problems = [missing_report_message(p) for p in parts if p.status == "crashed" and p.payload is None]
    problems += [f"{p.label} (ops: {', '.join(p.ops)}) was stopped {p.stopped}: "
                 + ("its report covers the properties done until then" if p.payload else "it left no report")
                 for p in parts if p.status == "stopped"]
    problems += merged.problems
    for record in extra_failures:
        record.backend = merged.backend.get("name") or backend_name or ""
    records = merged.records + extra_failures
    backend = merged.backend or {"name": backend_name}
    junit = {p.label: p.dir / "junit.xml" for p in parts if p.payload is not None}
    unreadable = report.merge_junit(junit, report_dir / "junit.xml", extra_failures)
    problems += [f"{label}: junit.xml missing or unreadable, left out of the merged junit.xml" for label in unreadable]
    merge_info = {"merge": {"jobs": len(parts), "problems": problems, "parts": [
        {"index": p.index, "ops": p.ops, "status": p.status, "returncode": p.returncode,
         "seconds": round(p.seconds, 3), "dir": str(p.dir)} for p in parts]}}
    report.write_json(report_dir / "conformance.json", records, backend, merged.settings, merge_info)
    report.write_markdown(report_dir / "conformance.md", records, backend, merged.settings, OP_NAMES,
                          part_notes(parts, problems))
    return records, problems, merged.settings


def print_summary(records: list, problems: list[str], settings: dict, report_dir: Path) -> None:
    """The merged run's summary, as a single run prints it."""
    from dsahal.conformance import report

    print(f"\n===== dsahal conformance (merged): backend {records[0].backend if records else '?'!r} =====")
    table = report.matrix(records)
    for op in [o for o in OP_NAMES if o in table]:
        print(f"  {op:<20} " + ", ".join(f"{fmt}={report.cell_status(c)}" for fmt, c in sorted(table[op].items())))
    counts = report.summary(records)
    print("  " + ", ".join(f"{counts[o]} {o}" for o in report.OUTCOMES if counts[o] or o in ("pass", "fail")))
    for record in records:
        if record.outcome in ("fail", "xpass"):
            print(f"  FAILED {record.id}: {record.property}")
    print(f"  settings: {settings}")
    print(f"  reports: {report_dir}/conformance.json, conformance.md, junit.xml (parts in {report_dir}/parts/)")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    sys.stdout.flush()


def exit_status(parts: list[Part], records: list, problems: list[str]) -> int:
    """1 when any part failed, crashed or was stopped, any test failed or never finished, or the parts
    disagree."""
    bad = {"failed", "crashed", "stopped"}
    if problems or any(p.status in bad for p in parts) or \
            any(r.outcome in ("fail", "xpass", "incomplete") for r in records):
        return 1
    return 0


def prepare(report_dir: Path) -> Path:
    """An empty ``parts/`` (a stale report of an earlier run must never stand in for a child that died)."""
    parts_dir = report_dir / "parts"
    if parts_dir.exists():
        shutil.rmtree(parts_dir)
    parts_dir.mkdir(parents=True)
    return parts_dir


def run_jobs(args, suite_dir: Path) -> int:
    """Run the suite as ``args.jobs`` children and merge their reports; the exit status of one run."""
    available = ops_with_tests(suite_dir)
    ops = [op for op in (args.ops or available) if op in available]
    if not ops:
        print(f"error: --ops: no conformance test for {args.ops}", file=sys.stderr)
        return 2
    seed = args.seed
    if seed is None and not args.derandomize:
        seed = random.SystemRandom().randrange(2**31)  # one seed for every child, printed once
    report_dir = Path(args.report_dir)
    parts_dir = prepare(report_dir)
    parts = [Part(i, group, parts_dir / str(i)) for i, group in enumerate(split_ops(ops, args.jobs))]
    print(f"dsahal conformance: {len(parts)} jobs over {len(ops)} op families"
          + (f" (asked for {args.jobs}; no more groups to split)" if len(parts) < args.jobs else "")
          + (f", seed {seed}" if seed is not None else ", derandomized") + f"; parts in {parts_dir}", flush=True)
    env = child_env(len(parts))
    for part in parts:
        part.command = child_command(args, part.ops, part.dir, seed)
        print(f"  {part.label}: {', '.join(part.ops)}", flush=True)
    try:
        with terminate_raises():
            for part in parts:
                launch(part, env)
            wait_all(parts, args.exitfirst)
    except (KeyboardInterrupt, Terminated) as exc:
        # Stop what still runs (or never started) and merge what the parts reported: a run cut by a
        # time limit still leaves the reports of what it did, and fails.
        why = f"on {exc}" if isinstance(exc, Terminated) else "on Ctrl-C"
        unfinished = [p for p in parts if p.returncode is None]
        print(f"{why}: stopping {', '.join(p.label for p in unfinished)}", flush=True)
        stop_all(unfinished, why)
    return finish(parts, args, report_dir, seed)


def finish(parts: list[Part], args, report_dir: Path, seed: int | None) -> int:
    """Logs of the failed children, the merged reports and the exit status of the whole run."""
    from dsahal.conformance.config import DEFAULT_MAX_EXAMPLES

    seen: dict[str, str] = {}
    for part in parts:
        if part.status in ("failed", "crashed", "usage"):  # a stopped part's log explains no failure
            print_log(part, seen)
    if any(p.status == "usage" for p in parts):
        print("error: a part stopped on a usage error (its log is above)", file=sys.stderr)
        return 2
    if all(p.status == "empty" for p in parts):
        print("error: no conformance test selected (check --ops / -k)", file=sys.stderr)
        return 2
    ops = sorted(args.ops) if args.ops else "all"
    defaults = {"max_examples": args.max_examples or DEFAULT_MAX_EXAMPLES, "derandomize": args.derandomize,
                "seed": seed, "ops": ops, "device": args.device}
    settings = {"ops": ops, "jobs": len(parts)}
    records, problems, settings = write_merged(parts, report_dir, settings, defaults,
                                               args.backend or os.environ.get("DSAHAL_BACKEND"))
    print_summary(records, problems, settings, report_dir)
    return exit_status(parts, records, problems)
