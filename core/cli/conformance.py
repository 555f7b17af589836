"""``dsahal conformance``: run the conformance suite against one backend and write its reports.

Exit status: 0 when every property passed (skips and fallbacks are reported, not failures),
1 on any failure, 2 on a usage error (unknown or unavailable backend, unknown op, missing or unreadable
control file, a device torch cannot place tensors on, a report folder that cannot be written, --seed with
--derandomize) and when the backend
under test cannot serve any op it declares because its routes fail to load (a ``"module:attr"`` that does
not import, a signature the op's spec cannot call): one ``error:`` line naming each op and path, and no
run, since every property would only certify the reference. Routes that fail to load on a backend that
serves other ops are one ``warning:`` line each, and the suite runs (those ops fall back, as reported).

``--jobs N`` (N > 1) lists the selected tests, splits them over N child processes balanced by an
estimated cost (the collectives stay together), each writing its reports to ``<report-dir>/parts/<i>/``
(with its output in ``log.txt``), and merges them into one report. Exit status as above; also 1 when
a child crashed or wrote no report (the report names its ops and fails each of its tests without a
record), when a child was stopped (its tests without a record are "incomplete"), or when the children
disagree on the backend under test.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ..ops.catalog import OP_NAMES


def conformance_dir() -> Path:
    import dsahal.conformance

    return Path(dsahal.conformance.__file__).resolve().parent


def pytest_args(args) -> list[str]:
    """The pytest command line equivalent to these options (also what a vendor's CI can run)."""
    report_dir = Path(args.report_dir)
    command = [str(conformance_dir()), "--rootdir", str(conformance_dir()), "-p", "no:cacheprovider",
               "--dsahal-report-dir", str(report_dir), "--junitxml", str(report_dir / "junit.xml"),
               "-o", "junit_family=xunit2", "-q" if not args.verbose else "-v", "-rfE"]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        command += ["-p", "dsahal.conformance.plugin"]
    if args.backend:
        command += ["--dsahal-backend", args.backend]
    if args.max_examples is not None:
        command += ["--dsahal-max-examples", str(args.max_examples)]
    if args.min_examples is not None:
        command += ["--dsahal-min-examples", str(args.min_examples)]
    if args.derandomize:
        command.append("--dsahal-derandomize")
    if args.seed is not None:
        command += ["--dsahal-seed", str(args.seed)]
    if args.skips:
        command += ["--dsahal-skips", args.skips]
    if args.xfails:
        command += ["--dsahal-xfails", args.xfails]
    if args.ops:
        command += ["--dsahal-ops", ",".join(args.ops)]
    if args.device:
        command += ["--dsahal-device", args.device]
    if args.tests:
        command += ["--dsahal-tests", args.tests]
    if args.k:
        command += ["-k", args.k]
    if args.exitfirst:
        command.append("-x")
    return command


def unloadable_routes(backend: str | None) -> tuple[str | None, list[str]]:
    """(an error when no op the backend declares has a usable route and some route failed to load, else
    None; one warning per route that failed to load). :func:`run` has refused an unknown or unavailable
    backend already; a table that still cannot be built (a ``DSAHAL_ROUTES`` naming a route the backend lacks)
    is left to the suite's own set-up, which reports it as a usage error."""
    from dsahal.ops.catalog import COMPOSITE_OPS
    from dsahal.registry import OpTable, RegistryError, registry, resolve_lazy, select
    from dsahal.registry.signature import adapt_to_spec

    try:
        reg = registry()
        record = select(reg, backend)
        table = OpTable(record, reg.records["reference"], OP_NAMES, COMPOSITE_OPS)
    except RegistryError:
        return None, []
    declared = [op for op in OP_NAMES if record.backend.routes(op)]
    failed: dict[str, list[str]] = {}
    for op in declared:
        by_name = {route.name: route for route in record.backend.routes(op)}
        for resolved in table.entries[op].routes:
            route = by_name.get(resolved.name)
            if resolved.available or route is None:
                continue
            try:  # a route turned off by its probe or an override loads; one that cannot load is broken
                for lazy in (route.fn, route.verifier):
                    if lazy is not None:
                        adapt_to_spec(op, resolve_lazy(lazy), f"backend {record.backend.name!r} route {route.name!r}")
            except Exception:  # noqa: BLE001 - any failure to load is what is reported, with the table's reason
                failed.setdefault(op, []).append(f"route {resolved.name!r}: {' '.join(resolved.reason.split())}")
    warnings = [f"backend {record.backend.name!r} op {op}: {why}" for op, whys in failed.items() for why in whys]
    servable = [op for op in declared if table.entries[op].active]
    if declared and not servable and failed:
        listing = "; ".join(f"{op} {why}" for op, whys in failed.items() for why in whys)
        return (f"backend {record.backend.name!r} cannot serve any op it declares ({', '.join(declared)}): its routes "
                f"fail to load: {listing}"), []
    return None, warnings


def device_error(device: str | None) -> str | None:
    """Why op arguments cannot be placed on ``device`` (None when they can, or no device was given): a name
    torch does not know, a CUDA device this machine lacks, or one a tensor cannot be read back from (``meta``)
    would fail every property at its set-up and publish the backend's failures. No CUDA context or XLA
    runtime is started here: a parent of ``--jobs`` children must not hold the device."""
    if not device:
        return None
    import torch

    try:
        where = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        return f"--device: {device!r} is not a torch device ({' '.join(str(exc).split())})"
    if where.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (where.index or 0) >= count:
            return f"--device: {device!r}: this machine has {count} CUDA device(s) visible to torch {torch.__version__}"
        return None
    if where.type == "xla":  # torch_xla registers the device; the backend's own set-up reports it missing
        return None
    try:
        torch.zeros(1, device=where).add(1).cpu()
    except Exception as exc:  # noqa: BLE001 - whatever the device refuses is the reason given
        return f"--device: cannot place op arguments on {device!r} ({' '.join(str(exc).split())})"
    return None


def report_dir_error(report_dir: str) -> str | None:
    """Why the reports cannot be written to ``report_dir`` (None when they can; the folder is created): a
    path under a file, a file in its place, an unwritable folder, a report name taken by a folder. Checked
    before the run, whose reports would otherwise be lost to a traceback at its end."""
    from . import check_output_path

    folder = Path(report_dir)
    if folder.exists() and not folder.is_dir():
        return f"--report-dir: {report_dir!r} is a file, not a directory"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--report-dir: cannot create the directory {report_dir!r} ({exc.strerror or exc})"
    for name in ("junit.xml", "conformance.json", "conformance.md"):
        try:
            check_output_path(str(folder / name))
        except ValueError as exc:
            return f"--report-dir: {exc}"
    return None


def tests_file_error(args) -> str | None:
    """Why ``--tests`` cannot select its tests (None when it can, or none was given): ids that name no test of
    the suite. Checked by listing the suite in a child process (``pytest --collect-only``, a few seconds) before
    the run, so the answer is one ``error:`` line, not the suite's own usage error (pytest's ``ERROR:`` line
    naming its ``--dsahal-tests`` option, or with ``--jobs`` the listing's whole log)."""
    from dsahal.conformance.jobs_plan import PART_ENV, list_tests

    if not args.tests or os.environ.get(PART_ENV):  # (a part of --jobs: its file is the parent's listing)
        return None
    import argparse
    import tempfile

    from dsahal.conformance import controls

    try:
        listed_ids = controls.read_test_ids(args.tests)
    except (OSError, UnicodeDecodeError) as exc:
        return f"--tests: cannot read {args.tests!r} ({exc})"
    whole_suite = argparse.Namespace(**{**vars(args), "tests": None, "ops": None, "k": None})
    with tempfile.TemporaryDirectory(prefix="dsahal-tests-") as folder:
        listed = list_tests(whole_suite, conformance_dir(), Path(folder) / "tests.jsonl")
    if isinstance(listed, int):
        return "--tests: listing the suite's tests failed (pytest output above)"
    _, missing = controls.match_test_ids(listed_ids, [t.nodeid for t in listed])
    if not missing:
        return None
    example = controls.canonical_id(listed[0].nodeid) if listed else "test_<op>.py::test_<property>[<case>]"
    return (f"--tests: {args.tests}: {len(missing)} listed test id(s) name no test of the conformance suite: "
            f"{controls.shown_ids(missing)} "
            f"(expected pytest node ids of the suite, e.g. {example})")


def run(args) -> int:
    import pytest

    from dsahal.conformance import controls

    if args.jobs < 1:
        print(f"error: --jobs: expected a positive number, got {args.jobs}", file=sys.stderr)
        return 2
    if args.max_examples is not None and args.max_examples < 1:
        print(f"error: --max-examples: expected a positive number, got {args.max_examples}", file=sys.stderr)
        return 2
    if args.min_examples is not None and args.min_examples < 0:
        print(f"error: --min-examples: expected 0 or a positive number, got {args.min_examples}", file=sys.stderr)
        return 2
    if args.seed is not None and args.derandomize:
        print(f"error: --seed: {args.seed} cannot be combined with --derandomize, which derives each test's seed "
              f"from the test (the seed would be ignored)", file=sys.stderr)
        return 2
    unknown = [op for op in (args.ops or []) if op not in OP_NAMES]
    if unknown:
        print(f"error: --ops: unknown op(s) {unknown}; expected some of {list(OP_NAMES)}", file=sys.stderr)
        return 2
    if args.ops:  # an op named twice is one family (reports and --jobs parts list each once)
        args.ops = list(dict.fromkeys(args.ops))
    for name in ("skips", "xfails", "tests"):
        path = getattr(args, name)
        if path and not Path(path).is_file():
            what = "a file, got a directory" if Path(path).is_dir() else "a file, got no such path" if not \
                Path(path).exists() else "a regular file, got a special file"
            print(f"error: --{name}: expected {what} {path!r}", file=sys.stderr)
            return 2
    for name in ("skips", "xfails"):
        path = getattr(args, name)
        try:
            if path:
                controls.read_control_file(path)
        except controls.ControlFileError as exc:
            print(f"error: --{name}: {exc}", file=sys.stderr)
            return 2
    from dsahal.registry import RegistryError, registry, select

    try:  # an unknown or unavailable backend is a usage error here, before any test process starts
        select(registry(), args.backend)
    except RegistryError as exc:
        print(f"error: {'--backend: ' if args.backend else ''}{exc}", file=sys.stderr)
        return 2
    if args.routes:
        from dsahal.registry.overrides import ENV, RouteOverrideError, parse

        try:
            parse(args.routes, source="--routes")
        except RouteOverrideError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        os.environ[ENV] = args.routes  # read when the backend's table is resolved (here and in job processes)
        from dsahal.registry import RegistryError, reset, set_backend

        reset()
        try:  # an unknown route is a usage error here, before any test process starts
            set_backend(args.backend)
        except RegistryError as exc:
            print(f"error: --routes: {exc}", file=sys.stderr)
            return 2
    broken, warnings = unloadable_routes(args.backend)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    if broken:
        print(f"error: {broken}", file=sys.stderr)
        return 2
    if args.compile_budget < 0:
        print(f"error: --compile-budget: expected 0 or a positive number, got {args.compile_budget}", file=sys.stderr)
        return 2
    # Bounded Triton compiles: the drawn strides would otherwise recompile nearly every example
    # (dsahal.backends.triton_kernels.compile_budget); read when a backend is built, here and in job processes.
    os.environ["DSAHAL_TRITON_COMPILE_BUDGET"] = str(args.compile_budget)
    for check in (lambda: device_error(args.device), lambda: report_dir_error(args.report_dir),
                  lambda: tests_file_error(args)):  # in order; the listing (a child process) only when the rest hold
        problem = check()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    if args.jobs > 1:
        from dsahal.conformance.jobs import run_jobs

        return run_jobs(args, conformance_dir())
    code = int(pytest.main(pytest_args(args)))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("error: no conformance test selected (check --ops / -k)", file=sys.stderr)
        return 2
    if code == pytest.ExitCode.USAGE_ERROR:
        return 2
    return 0 if code == pytest.ExitCode.OK else 1


def register(subparsers) -> None:
    from dsahal.conformance.config import DEFAULT_MAX_EXAMPLES

    parser = subparsers.add_parser(
        "conformance", help="certify a backend against the reference (hypothesis properties, reports)",
        description=__doc__)
    parser.add_argument("--backend", default=None,
                        help="backend under test (default: DSAHAL_BACKEND, else automatic selection)")
    parser.add_argument("--routes", default=None, metavar="SPEC",
                        help="certify chosen routes: DSAHAL_ROUTES text, e.g. sparse_mla:triton or sparse_mla:-flashmla_decode "
                             "(the report names the route that served each example)")
    parser.add_argument("--skips", default=None, metavar="FILE", help="test-id prefixes to skip, '# reason' comments")
    parser.add_argument("--xfails", default=None, metavar="FILE", help="test-id prefixes expected to fail")
    parser.add_argument("--max-examples", type=int, default=None, metavar="N",
                        help=f"hypothesis examples per property (default {DEFAULT_MAX_EXAMPLES}; CI uses fewer)")
    parser.add_argument("--min-examples", type=int, default=None, metavar="N",
                        help="every property runs at least N examples (the expensive ones run a fraction of "
                             "--max-examples otherwise): what a per-hardware certification at a fixed count asks")
    parser.add_argument("--derandomize", action="store_true", help="derive hypothesis' seed from each test")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
    parser.add_argument("--report-dir", default="conformance-report", metavar="D",
                        help="where junit.xml, conformance.json and conformance.md go (default ./conformance-report)")
    parser.add_argument("--ops", nargs="+", default=None, metavar="OP", choices=OP_NAMES,
                        help="run only these op families")
    parser.add_argument("--device", default=None,
                        help="device for op arguments (default: from the backend's tags: cuda, xla or cpu)")
    parser.add_argument("-k", default=None, metavar="EXPR", help="pytest -k expression to select properties")
    parser.add_argument("--tests", default=None, metavar="FILE",
                        help="run only the tests whose node ids FILE lists, one a line (what --jobs gives each part)")
    parser.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    parser.add_argument("-v", "--verbose", action="store_true", help="one line per property")
    parser.add_argument("--compile-budget", type=int, default=4, metavar="N",
                        help="Triton kernels: alignment-specialised compiles kept per kernel and configuration; "
                             "further patterns of drawn strides share one generic compile (default 4; 0: "
                             "every pattern compiles, as in serving)")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="split the selected tests over N processes and merge their reports (GPUs: Triton "
                             "compiles on the CPU, one core per process); parts go to REPORT_DIR/parts/<i>")
    parser.set_defaults(func=run)
