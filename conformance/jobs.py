"""``dsahal conformance --jobs N``: the suite's tests split over N child processes, whose reports are
merged into those of one run.

The plan (which tests each child runs, its command and environment) is :mod:`dsahal.conformance.jobs_plan`;
this module runs it. Each child's output goes to ``parts/<i>/log.txt``; one line is printed as each child
finishes, then the logs of the children that failed, then the merged summary. ``<D>`` gets the merged
conformance.json, conformance.md and junit.xml, with a record for every listed test: a test whose part
crashed before reporting it fails, one whose part was stopped (Ctrl-C, SIGTERM, -x) is "incomplete".
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
from pathlib import Path

from dsahal.conformance import controls, report
from dsahal.conformance.config import DEFAULT_MAX_EXAMPLES
from dsahal.conformance.jobs_plan import (
    LOG_TAIL_LINES,
    Part,
    child_command,
    child_env,
    estimated_costs,
    list_tests,
    split_tests,
)
from dsahal.ops.catalog import OP_NAMES

POLL_S = 0.1
STOP_GRACE_S = 15.0  # for a stopped child to write its partial reports (a Triton compile is not interruptible)


class Terminated(Exception):
    """SIGTERM or SIGHUP reached the parent (``timeout``, a CI cancel): stop the children and merge."""


def _child_setup() -> None:
    """In the child before it runs the part: its own process group (same session, so whoever ends our session
    ends them too: stopping or reaping a child reaches the gloo ranks it spawned, and nothing else), and SIGINT
    at its default, since :func:`stop_all` stops a child by SIGINT. A parent started in the background by a
    non-interactive shell (``cmd &``, as CI runners and ``nohup`` jobs do) has SIGINT ignored, and an ignored
    signal stays ignored across exec: its children would then never see the interrupt, write no partial
    report and be killed after the grace period."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def launch(part: Part, env: dict) -> None:
    part.dir.mkdir(parents=True, exist_ok=True)
    with part.log.open("wb") as log:
        part.process = subprocess.Popen(part.command, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, preexec_fn=_child_setup)
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
    try:
        part.payload = report.read_json(path)
    except (OSError, ValueError) as exc:
        part.read_error = f"unreadable conformance.json: {exc}"


def progress_line(part: Part, done: int, total: int) -> str:
    counts = (part.payload or {}).get("summary") or {}
    shown = ", ".join(f"{counts.get(o, 0)} {o}" for o in report.OUTCOMES
                      if counts.get(o) or o in ("pass", "fail")) if counts else "no report"
    return (f"[{done}/{total}] {part.label} ({part.what}): {part.status}, {part.describe_exit()} "
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
    print(f"\n===== {part.label} ({part.what}): {part.status}; log {part.log} =====", flush=True)
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
    return (f"{part.label} ({part.what}) {part.describe_exit()} and {why}: "
            f"these ops are NOT certified by this run; log {part.log}")


def stopped_message(part: Part) -> str:
    missing = len(part.unreported())
    return (f"{part.label} ({part.what}) was stopped {part.stopped}: "
            + ("its report covers the tests done until then" if part.payload else "it left no report")
            + (f"; {missing} of its tests without a record are reported incomplete" if missing else ""))


def part_records(part: Part) -> list:
    """Records the part could not write itself, so that the merged JSON, markdown and junit never read
    as a pass: for a part that was stopped, each of its tests without a record is "incomplete"; for one
    that crashed (or exited non-zero with no failing test in its report, or left tests unreported), each
    such test fails (one failing record per op when every test has a record)."""
    missing = part.unreported()
    if part.status == "stopped":
        outcome = "incomplete"
        message = f"{part.label} ({part.what}) was stopped {part.stopped} before this test reported"
    elif part.status == "crashed":
        outcome, message = "fail", missing_report_message(part) if part.payload is None else \
            f"{part.label} ({part.what}) {part.describe_exit()}; log {part.log}"
    elif part.status == "failed" and not any(t["outcome"] in ("fail", "xpass") for t in part.payload["tests"]):
        outcome, message = "fail", f"{part.label} ({part.what}) {part.describe_exit()} but reported no failing test"
    elif missing:
        outcome, message = "fail", f"{part.label} ({part.what}) {part.describe_exit()} without a record of this test"
    else:
        return []
    if outcome == "fail":
        tail = part.log.read_text(errors="replace").splitlines()[-40:] if part.log.is_file() else []
        message += ("\nlast lines of its log:\n" + "\n".join(tail)) if tail else ""
    if missing:
        return [report.TestRecord(id=controls.canonical_id(t.nodeid), nodeid=t.nodeid, op=t.op, property=t.property,
                                  format=t.format, backend="", outcome=outcome, message=message) for t in missing]
    if outcome != "fail":
        return []
    return [report.TestRecord(id=f"parts/{part.index}::{op}", nodeid=f"parts/{part.index}::{op}", op=op,
                              property="run.part_completed", format="-", backend="", outcome="fail",
                              message=message) for op in part.ops]


def part_notes(parts: list[Part], problems: list[str]) -> list[str]:
    """Markdown lines for the merged report: each part, and every problem in bold."""
    notes = [f"Parts (`--jobs {len(parts)}`, in `parts/<i>/`):"]
    notes += [f"- {p.label} ({p.what}): {p.status}, {p.describe_exit()} after {p.seconds:.0f} s"
              for p in parts]
    notes += [f"- **problem**: {problem}" for problem in problems]
    return notes


def write_merged(parts: list[Part], report_dir: Path, settings: dict, defaults: dict,
                 backend_name: str | None) -> tuple[list, list[str], dict]:
    """Merge the parts' reports into ``report_dir``: ``settings`` override the parts' own, ``defaults``
    stand in where no part left a report. Returns (records, problems, settings)."""
    merged = report.merge({p.label: p.payload for p in parts if p.payload is not None}, settings)
    merged.settings = {**defaults, **merged.settings}
    extra_records = [r for p in parts for r in part_records(p)]
    problems = [missing_report_message(p) for p in parts if p.status == "crashed" and p.payload is None]
    problems += [stopped_message(p) for p in parts if p.status == "stopped"]
    problems += merged.problems
    for record in extra_records:
        record.backend = merged.backend.get("name") or backend_name or ""
    # the suite's order, as one run writes it (a file's tests may be spread over several parts)
    position = {controls.canonical_id(t.nodeid): t.index for p in parts for t in p.tests}
    records = sorted(merged.records + extra_records, key=lambda r: position.get(r.id, len(position)))
    backend = merged.backend or {"name": backend_name}
    junit = {p.label: p.dir / "junit.xml" for p in parts if p.payload is not None}
    unreadable = report.merge_junit(junit, report_dir / "junit.xml", extra_records)
    problems += [f"{label}: junit.xml missing or unreadable, left out of the merged junit.xml" for label in unreadable]
    merge_info = {"merge": {"jobs": len(parts), "problems": problems, "parts": [
        {"index": p.index, "ops": p.ops, "tests": [t.nodeid for t in p.tests], "status": p.status,
         "unreported": len(p.unreported()), "returncode": p.returncode,
         "seconds": round(p.seconds, 3), "dir": str(p.dir)} for p in parts]}}
    report.write_json(report_dir / "conformance.json", records, backend, merged.settings, merge_info)
    report.write_markdown(report_dir / "conformance.md", records, backend, merged.settings, OP_NAMES,
                          part_notes(parts, problems))
    return records, problems, merged.settings


def print_summary(records: list, problems: list[str], settings: dict, report_dir: Path) -> None:
    """The merged run's summary, as a single run prints it."""
    print(f"\n===== dsahal conformance (merged): backend {records[0].backend if records else '?'!r} =====")
    table = report.matrix(records)
    for op in [o for o in OP_NAMES if o in table]:
        print(f"  {op:<20} {report.op_cells(table[op])}")
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


def plan(args, suite_dir: Path, parts_dir: Path, seed: int | None) -> list[Part] | int:
    """List the selected tests, split them into parts, write each part's tests file and command and
    print the plan; an exit status when there is nothing to run."""
    listed = list_tests(args, suite_dir, parts_dir / "tests.jsonl")
    if isinstance(listed, int):
        return listed
    selected = [t for t in listed if t.selected]
    if not selected:
        print("error: no conformance test selected (check --ops / -k)", file=sys.stderr)
        return 2
    parts = [Part(i, tests, parts_dir / str(i)) for i, tests in enumerate(split_tests(listed, args.jobs))]
    ops = {t.op for t in selected}
    print(f"dsahal conformance: {len(parts)} jobs over {len(selected)} tests of {len(ops)} op families"
          + (f" (asked for {args.jobs}; no more tests to split)" if len(parts) < args.jobs else "")
          + (f", seed {seed}" if seed is not None else ", derandomized") + f"; parts in {parts_dir}", flush=True)
    costs = estimated_costs(listed)
    for part in parts:
        part.dir.mkdir(parents=True)
        part.tests_file.write_text("".join(f"{t.nodeid}\n" for t in part.tests))
        part.command = child_command(args, part.ops, part.dir, seed, part.tests_file)
        cost = sum(costs[t.nodeid] for t in part.tests)
        print(f"  {part.label} ({part.what}; estimated cost {cost:.1f})", flush=True)
    return parts


def run_jobs(args, suite_dir: Path) -> int:
    """Run the suite as ``args.jobs`` children and merge their reports; the exit status of one run."""
    seed = args.seed
    if seed is None and not args.derandomize:
        seed = random.SystemRandom().randrange(2**31)  # one seed for every child, printed once
    report_dir = Path(args.report_dir)
    parts_dir = prepare(report_dir)
    parts: list[Part] = []
    try:
        with terminate_raises():
            planned = plan(args, suite_dir, parts_dir, seed)
            if isinstance(planned, int):
                return planned
            parts = planned
            env = child_env(len(parts))
            for part in parts:
                launch(part, env)
            wait_all(parts, args.exitfirst)
    except (KeyboardInterrupt, Terminated) as exc:
        # Stop what still runs (or never started) and merge what the parts reported: a run cut by a
        # time limit still leaves the reports of what it did, and fails.
        why = f"on {exc}" if isinstance(exc, Terminated) else "on Ctrl-C"
        if not parts:
            print(f"error: stopped {why} while listing the tests; nothing ran", file=sys.stderr)
            return 1
        unfinished = [p for p in parts if p.returncode is None]
        print(f"{why}: stopping {', '.join(p.label for p in unfinished)}", flush=True)
        stop_all(unfinished, why)
    return finish(parts, args, report_dir, seed)


def finish(parts: list[Part], args, report_dir: Path, seed: int | None) -> int:
    """Logs of the failed children, the merged reports and the exit status of the whole run."""
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
    defaults = {"max_examples": args.max_examples or DEFAULT_MAX_EXAMPLES, "min_examples": args.min_examples or 0,
                "derandomize": args.derandomize,
                "seed": seed, "ops": ops, "device": args.device}
    settings = {"ops": ops, "jobs": len(parts)}
    records, problems, settings = write_merged(parts, report_dir, settings, defaults,
                                               args.backend or os.environ.get("DSAHAL_BACKEND"))
    print_summary(records, problems, settings, report_dir)
    return exit_status(parts, records, problems)
