"""``dsahal conformance --jobs N``, what runs where: the suite's tests listed by a child pytest, split
into N parts on an estimated cost, and each part's child command and environment.

Why: on a GPU most of the suite's time is Triton compiling a kernel for each shape specialisation,
which is CPU-bound, and one process keeps one core busy. Tests are independent (each property draws
its own inputs), so sets of them can run side by side and their reports be concatenated. Splitting by
test rather than by op family matters: one family (sparse MLA, ~20 tests) alone would otherwise be the
floor of the wall time whatever N is.

First a child ``pytest --collect-only --dsahal-list-tests`` lists the selected tests (``--ops``, ``-k``,
the skip file applied; nothing runs) to ``<D>/parts/tests.jsonl``. They are assigned to N parts by
longest-processing-time-first on an estimated cost (an op family's weight shared among its tests; the
collectives stay in one part, so only one pool of gloo ranks starts). Each child is
``python -m dsahal conformance ... --ops <its ops> --tests <D>/parts/<i>/tests.txt --report-dir
<D>/parts/<i>`` with every other option passed through and one seed drawn for all.
:mod:`dsahal.conformance.jobs` runs the parts and merges their reports.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dsahal.conformance.controls import canonical_id
from dsahal.ops.catalog import COLLECTIVE_OPS, OP_NAMES

# Relative cost of an op family's properties on a GPU (roughly: tests x kernels compiled per test),
# shared equally among the family's tests. Only the balance between parts depends on it; an op missing
# here gets DEFAULT_WEIGHT. (A test skipped for a format the backend does not claim costs next to
# nothing, but claims are only known once a backend is selected, in the children: not estimated.)
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
VENDOR_SKIP_WEIGHT = 0.01  # a test the skip file skips: set-up only
PART_ENV = "DSAHAL_CONFORMANCE_PART"  # set in the children of --jobs (child_env)
LOG_TAIL_LINES = 300  # lines of a child's output printed when it failed


@dataclass(frozen=True)
class Listed:
    """One line of ``--dsahal-list-tests``: a collected test of the suite."""

    nodeid: str
    op: str
    property: str = ""
    format: str = "-"
    selected: bool = True  # kept by --ops / -k / --tests
    vendor_skip: bool = False  # the skip file skips it
    index: int = 0  # its place in the suite's order

    @classmethod
    def from_json(cls, line: str, index: int) -> "Listed":
        entry = json.loads(line)
        return cls(**{key: entry[key] for key in cls.__dataclass_fields__ if key in entry}, index=index)


def list_command(args, suite_dir: Path, out: Path) -> list[str]:
    """``pytest --collect-only`` over the suite with the selecting options of ``args``, writing the
    tests to ``out`` (the same root directory as the children, so the same node ids)."""
    command = [sys.executable, "-m", "pytest", str(suite_dir), "--rootdir", str(suite_dir), "-p", "no:cacheprovider",
               "-q", "--collect-only", "--dsahal-list-tests", str(out)]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        command += ["-p", "dsahal.conformance.plugin"]
    valued = (("--dsahal-ops", ",".join(args.ops) if args.ops else None), ("--dsahal-skips", args.skips),
              ("--dsahal-xfails", args.xfails), ("--dsahal-tests", getattr(args, "tests", None)), ("-k", args.k))
    for flag, value in valued:
        if value is not None:
            command += [flag, str(value)]
    return command


def list_tests(args, suite_dir: Path, out: Path) -> list[Listed] | int:
    """Every collected test of the suite (``selected`` says which the options keep), in suite order;
    an exit status when the listing failed (2 on a usage error), its output then printed."""
    command = list_command(args, suite_dir, out)
    log = out.with_suffix(".log")
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, errors="replace", env=child_env(1))
    log.write_text(proc.stdout)
    if proc.returncode in (0, 5) and out.is_file():  # 5: nothing left selected, as the listing wants
        lines = [line for line in out.read_text().splitlines() if line.strip()]
        return [Listed.from_json(line, i) for i, line in enumerate(lines)]
    usage = [line[len("ERROR: "):].strip() for line in proc.stdout.splitlines() if line.startswith("ERROR: ")]
    if proc.returncode == 4 and usage:  # pytest's usage error: its own message lines, as ours (not the log)
        for line in usage:
            print(f"error: {line}", file=sys.stderr)
        return 2
    print("\n".join(proc.stdout.splitlines()[-LOG_TAIL_LINES:]), flush=True)
    print(f"error: listing the conformance tests failed (pytest exit status {proc.returncode}; "
          f"{' '.join(command)}; log {log})", file=sys.stderr)
    return 2 if proc.returncode == 4 else 1  # 4: pytest's usage error


def estimated_costs(listed: list[Listed]) -> dict[str, float]:
    """Estimated cost of each test: its op family's weight over the family's tests (all collected
    ones, so that -k leaves each kept test its share), next to nothing for one the skip file skips."""
    per_op = Counter(t.op for t in listed)
    return {t.nodeid: VENDOR_SKIP_WEIGHT if t.vendor_skip else OP_WEIGHTS.get(t.op, DEFAULT_WEIGHT) / per_op[t.op]
            for t in listed}


def _units(listed: list[Listed]) -> list[tuple[list[Listed], float]]:
    """Indivisible groups of the selected tests with their cost: every test alone, except the tests
    of the collectives together (with the start-up of their rank pool)."""
    costs = estimated_costs(listed)
    selected = [t for t in listed if t.selected]
    collective = [t for t in selected if t.op in COLLECTIVE_OPS]
    units = [([t], costs[t.nodeid]) for t in selected if t.op not in COLLECTIVE_OPS]
    if collective:
        units.append((collective, RANK_POOL_STARTUP_WEIGHT + sum(costs[t.nodeid] for t in collective)))
    return units


def split_tests(listed: list[Listed], jobs: int) -> list[list[Listed]]:
    """At most ``jobs`` non-empty parts of the selected tests of ``listed``, balanced on the estimated
    cost by longest-processing-time-first (costliest unit into the lightest part); each part keeps the
    suite's order of its tests, parts costliest first."""
    position = {t.nodeid: i for i, t in enumerate(listed)}
    units = sorted(_units(listed), key=lambda unit: (-unit[1], position[unit[0][0].nodeid]))
    parts: list[tuple[float, list[Listed]]] = [(0.0, []) for _ in range(min(jobs, len(units)))]
    for tests, cost in units:
        lightest = min(range(len(parts)), key=lambda i: parts[i][0])
        load, members = parts[lightest]
        parts[lightest] = (load + cost, members + tests)
    parts = [(load, sorted(members, key=lambda t: position[t.nodeid])) for load, members in parts]
    parts.sort(key=lambda part: (-part[0], position[part[1][0].nodeid]))
    return [members for _, members in parts]


@dataclass
class Part:
    """One child run: its tests, report directory, process and what it left behind."""

    index: int
    tests: list[Listed]
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
    def ops(self) -> list[str]:
        """The op families of its tests, in the catalog's order."""
        order = {op: i for i, op in enumerate(OP_NAMES)}
        return sorted({t.op for t in self.tests}, key=lambda op: (order.get(op, len(order)), op))

    @property
    def what(self) -> str:
        """What a message names: ``ops: a, b; 7 tests``."""
        count = len(self.tests)
        return f"ops: {', '.join(self.ops)}; {count} test{'' if count == 1 else 's'}"

    @property
    def log(self) -> Path:
        return self.dir / "log.txt"

    @property
    def tests_file(self) -> Path:
        return self.dir / "tests.txt"

    def unreported(self) -> list[Listed]:
        """Its tests of which its report (if any) has no record."""
        recorded = {canonical_id(t.get("nodeid") or t.get("id", "")) for t in (self.payload or {}).get("tests", [])}
        return [t for t in self.tests if canonical_id(t.nodeid) not in recorded]

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


def child_command(args, ops: list[str], report_dir: Path, seed: int | None, tests_file: Path) -> list[str]:
    """``python -m dsahal conformance`` for one part: its ops and tests file, and every option of ours
    except --jobs, --ops, --tests and --report-dir passed through unchanged."""
    command = [sys.executable, "-m", "dsahal", "conformance", "--ops", *ops, "--tests", str(tests_file),
               "--report-dir", str(report_dir)]
    valued = (("--backend", args.backend), ("--skips", args.skips), ("--xfails", args.xfails),
              ("--max-examples", args.max_examples), ("--min-examples", getattr(args, "min_examples", None)),
              ("--compile-budget", getattr(args, "compile_budget", None)),
              ("--seed", seed), ("--device", args.device), ("-k", args.k))
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
    env[PART_ENV] = "1"  # the child's --tests file is the listing's own: the child need not list the suite again
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env
