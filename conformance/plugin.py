"""The pytest plugin of the conformance suite (entry point ``pytest11: dsahal_conformance``).

Inert unless the suite runs: it only adds ``--dsahal-*`` options and a marker; every other hook
acts on items marked ``@pytest.mark.conformance`` that live in this package, and does nothing
(selects no backend, writes no report) when none was collected. Run it with
``pytest --pyargs dsahal.conformance --dsahal-backend NAME`` or ``dsahal conformance``.

``--dsahal-list-tests FILE`` writes one JSON line per collected test of the suite (nodeid, op, property,
format, whether the selection options keep it, whether a skip file skips it) and runs none: what
``dsahal conformance --jobs N`` splits. ``--dsahal-tests FILE`` runs only the node ids a file lists,
one a line (what each of those N parts runs); a listed id that is not collected is a usage error.
"""
from __future__ import annotations

import json
import os
import random
import warnings
from pathlib import Path

import pytest

from dsahal.conformance import controls, report
from dsahal.conformance.config import CONFIG
from dsahal.conformance.harness import CAPABILITY_FLAGS, PropertyRun, default_device

PACKAGE_DIR = Path(__file__).resolve().parent
RUN_KEY = pytest.StashKey[PropertyRun]()
LISTED_KEY = pytest.StashKey[list]()  # --dsahal-list-tests: every suite item, before any deselection


class SuiteState:
    """What one session of the suite collected: controls, the table under test, results."""

    def __init__(self):
        self.items: list = []
        self.table = None
        self.records: dict[str, report.TestRecord] = {}
        self.skips: list[controls.ControlEntry] = []
        self.xfails: list[controls.ControlEntry] = []
        self.device = "cpu"


_STATE: SuiteState | None = None


def pytest_addoption(parser) -> None:
    group = parser.getgroup("dsahal-conformance", "dsahal conformance suite")
    group.addoption("--dsahal-backend", default=None, help="backend under test (default: DSAHAL_BACKEND or automatic)")
    group.addoption("--dsahal-max-examples", type=int, default=None, help="hypothesis examples per property")
    group.addoption("--dsahal-min-examples", type=int, default=None,
                    help="examples every property runs at least (a floor under the scaled budgets)")
    group.addoption("--dsahal-derandomize", action="store_true", default=False, help="derandomize hypothesis")
    group.addoption("--dsahal-seed", type=int, default=None, help="hypothesis seed (default: a random one, printed)")
    group.addoption("--dsahal-skips", default=None, help="file of test-id prefixes to skip (# comments)")
    group.addoption("--dsahal-xfails", default=None, help="file of test-id prefixes expected to fail")
    group.addoption("--dsahal-report-dir", default=None, help="write conformance.json/.md and junit.xml here")
    group.addoption("--dsahal-ops", default=None, help="comma-separated op families to run (default: all)")
    group.addoption("--dsahal-device", default=None, help="device for op arguments (default: from the backend's tags)")
    group.addoption("--dsahal-tests", default=None,
                    help="file of node ids to run, one a line; the rest is deselected (an id not collected: "
                         "usage error)")
    group.addoption("--dsahal-list-tests", default=None,
                    help="write one JSON line per collected conformance test to this file and run none")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "conformance(op, prop, needs): a dsahal conformance property")
    option = config.option
    # Settings are only read by the suite's own modules, at import: harmless for other test runs.
    CONFIG.backend = option.dsahal_backend
    if option.dsahal_max_examples is not None:
        CONFIG.max_examples = max(1, option.dsahal_max_examples)
    if option.dsahal_min_examples is not None:
        CONFIG.min_examples = max(0, option.dsahal_min_examples)
    CONFIG.derandomize = bool(option.dsahal_derandomize)
    CONFIG.seed = option.dsahal_seed
    CONFIG.ops = frozenset(o.strip() for o in option.dsahal_ops.split(",") if o.strip()) if option.dsahal_ops else None
    CONFIG.report_dir = option.dsahal_report_dir
    CONFIG.device = option.dsahal_device
    CONFIG.skips_file, CONFIG.xfails_file = option.dsahal_skips, option.dsahal_xfails
    if CONFIG.report_dir and not getattr(option, "xmlpath", None):
        Path(CONFIG.report_dir).mkdir(parents=True, exist_ok=True)
        option.xmlpath = str(Path(CONFIG.report_dir) / "junit.xml")
    if CONFIG.seed is None and not CONFIG.derandomize and _running_suite(config):
        CONFIG.seed = random.SystemRandom().randrange(2**31)  # pinned so every failure can be re-run
    if option.dsahal_list_tests:
        config.pluginmanager.register(SuiteLister(Path(option.dsahal_list_tests)), "dsahal-conformance-lister")


def _running_suite(config) -> bool:
    """Whether the command line points at this package (by path or ``--pyargs``)."""
    for arg in config.args:
        target = str(arg).split("::")[0]
        if target.startswith("dsahal.conformance"):
            return True
        try:
            if PACKAGE_DIR in [Path(target).resolve(), *Path(target).resolve().parents]:
                return True
        except OSError:
            continue
    return False


def is_suite_item(item) -> bool:
    if item.get_closest_marker("conformance") is None:
        return False
    path = Path(str(item.fspath)).resolve()
    return path.parent == PACKAGE_DIR


class SuiteLister:
    """``--dsahal-list-tests FILE``: after every other deselection (``-k``, ``-m``), one JSON line per
    suite test to FILE (``selected``: whether it would have run), then deselects them all."""

    def __init__(self, path: Path):
        self.path = path

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items) -> None:
        listed = config.stash.get(LISTED_KEY, [])
        kept = {item.nodeid for item in items}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w") as out:
            for entry in listed:
                out.write(json.dumps({**entry, "selected": entry["nodeid"] in kept}) + "\n")
        if items:
            config.hook.pytest_deselected(items=list(items))
            items[:] = []


def _read_test_ids(path: str, suite_items: list) -> set[str]:
    """The node ids ``--dsahal-tests`` lists (:func:`.controls.read_test_ids`), each as collected here; any that
    names no collected test is a usage error."""
    try:
        listed = controls.read_test_ids(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise pytest.UsageError(f"--dsahal-tests: cannot read {path!r}: {exc}") from None
    found, missing = controls.match_test_ids(listed, [item.nodeid for item in suite_items])
    if missing:
        raise pytest.UsageError(f"--dsahal-tests {path}: {len(missing)} listed test(s) not collected: "
                                f"{controls.shown_ids(missing)}")
    return set(found.values())


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselect, so control entries are matched against every test
def pytest_collection_modifyitems(session, config, items) -> None:
    global _STATE
    suite_items = [i for i in items if is_suite_item(i)]
    if not suite_items:
        return
    state = SuiteState()
    try:
        state.skips = controls.read_control_file(CONFIG.skips_file) if CONFIG.skips_file else []
        state.xfails = controls.read_control_file(CONFIG.xfails_file) if CONFIG.xfails_file else []
    except (FileNotFoundError, controls.ControlFileError) as exc:
        raise pytest.UsageError(str(exc)) from None
    wanted = _read_test_ids(config.option.dsahal_tests, suite_items) if config.option.dsahal_tests else None
    listing = bool(config.option.dsahal_list_tests)
    if listing:  # no backend is selected: the listing runs nothing and writes no report
        _check_ops()
        config.stash[LISTED_KEY] = []
    else:
        _select_backend(state)
        _STATE = state
    deselected = []
    for item in suite_items:
        marker = item.get_closest_marker("conformance")
        op = marker.kwargs["op"]
        skip, xfail = controls.match(state.skips, item.nodeid), controls.match(state.xfails, item.nodeid)
        if listing:
            fmt = item.callspec.params.get("fmt") if hasattr(item, "callspec") else None
            config.stash[LISTED_KEY].append({"nodeid": item.nodeid, "op": op, "property": marker.kwargs["prop"],
                                             "format": fmt or "-", "vendor_skip": skip is not None})
        if (CONFIG.ops is not None and op not in CONFIG.ops) or (wanted is not None and item.nodeid not in wanted):
            deselected.append(item)
            continue
        if listing:
            continue
        if skip:
            item.add_marker(pytest.mark.skip(reason=f"vendor skip ({skip.source}): {skip.reason}"))
        elif xfail:
            item.add_marker(pytest.mark.xfail(reason=f"vendor xfail ({xfail.source}): {xfail.reason}", strict=False))
        state.items.append(item)
    for entry in controls.stale(state.skips) + controls.stale(state.xfails):
        message = f"dsahal conformance: stale control entry {entry.prefix!r} ({entry.source}) matches no test"
        warnings.warn(message, pytest.PytestWarning, stacklevel=1)
        print(f"WARNING: {message}")
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [i for i in items if i not in set(deselected)]


def _check_ops() -> None:
    from dsahal.ops.catalog import OP_NAMES

    if CONFIG.ops is not None and not CONFIG.ops <= set(OP_NAMES):
        raise pytest.UsageError(f"--ops: unknown op(s) {sorted(CONFIG.ops - set(OP_NAMES))}; "
                                f"expected some of {list(OP_NAMES)}")


def _select_backend(state: SuiteState) -> None:
    from dsahal.registry import RegistryError, set_backend

    _check_ops()
    try:
        state.table = set_backend(CONFIG.backend)
    except RegistryError as exc:
        raise pytest.UsageError(f"dsahal conformance: {exc}") from None
    state.device = CONFIG.device or default_device(state.table.record.backend)


def _format_claimed(capabilities, fmt_id: str | None) -> tuple[bool, str]:
    if not fmt_id:
        return True, ""
    for part in fmt_id.split("+"):
        kind, name = part.split(":")
        claimed = capabilities.latent_formats if kind == "latent" else capabilities.index_formats
        if claimed is not None and name not in claimed:
            return False, f"backend does not claim {kind} format {name!r} (claims {sorted(claimed)})"
    return True, ""


@pytest.fixture
def conformance(request) -> PropertyRun:
    """The property's tracker; skips (with the reason) what the backend does not claim or implement."""
    item = request.node
    if _STATE is None or _STATE.table is None:
        pytest.skip("the dsahal conformance suite was not configured (run it via dsahal conformance)")
    marker = item.get_closest_marker("conformance")
    op, prop, needs = marker.kwargs["op"], marker.kwargs["prop"], marker.kwargs.get("needs", ())
    fmt = item.callspec.params.get("fmt") if hasattr(item, "callspec") else None
    table = _STATE.table
    for key, value in (("op", op), ("property", prop), ("format", fmt or "-"), ("backend", table.name)):
        item.user_properties.append((key, value))  # carried into junit.xml
    caps = table.record.backend.capabilities
    for flag in needs:
        if flag in CAPABILITY_FLAGS and not getattr(caps, flag):
            pytest.skip(f"backend {table.name!r} does not claim {flag}")
    ok, why = _format_claimed(caps, fmt)
    if not ok:
        pytest.skip(why)
    entry = table.entries[op]
    if entry.status == "fallback":
        pytest.skip(f"fallback: {entry.reason} (served by the reference; not the backend's pass)")
    run = PropertyRun(backend=table.name, table=table, op=op, prop=prop, fmt=fmt,
                      test_id=controls.canonical_id(item.nodeid), device=_STATE.device)
    item.stash[RUN_KEY] = run
    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if _STATE is None or not is_suite_item(item):
        return
    rep = outcome.get_result()
    run = item.stash.get(RUN_KEY, None)
    if rep.when == "call" and rep.passed and run is not None and not hasattr(rep, "wasxfail"):
        if run.native_examples == 0:
            reason = (f"fallback: every example was served by the reference ({run.fallback_reason()})"
                      if run.fallback_examples else "no example exercised the backend")
            rep.outcome = "skipped"
            rep.longrepr = (str(item.fspath), item.location[1] or 0, reason)
    _record(item, rep, run)


def _record(item, rep, run) -> None:
    marker = item.get_closest_marker("conformance")
    record = _STATE.records.get(item.nodeid)
    if record is None:
        fmt = item.callspec.params.get("fmt") if hasattr(item, "callspec") else None
        record = _STATE.records[item.nodeid] = report.TestRecord(
            id=controls.canonical_id(item.nodeid), nodeid=item.nodeid, op=marker.kwargs["op"],
            property=marker.kwargs["prop"], format=fmt or "-", backend=_STATE.table.name)
    record.duration_s += rep.duration
    if run is not None:
        record.examples = len(run.examples)
        record.native_examples, record.fallback_examples = run.native_examples, run.fallback_examples
        record.routes = run.routes
    if rep.failed:
        record.outcome = "fail" if record.outcome != "fail" else record.outcome
        record.message = record.message or str(rep.longreprtext)[-6000:]
    elif rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        if hasattr(rep, "wasxfail"):
            record.outcome, record.message = "xfail", rep.wasxfail
        else:
            reason = reason.removeprefix("Skipped: ")
            record.outcome = "fallback" if reason.startswith("fallback:") else "skip"
            record.message = reason
    elif rep.when == "call" and hasattr(rep, "wasxfail"):
        record.outcome, record.message = "xpass", f"unexpectedly passed: {rep.wasxfail}"
    elif rep.when == "call" and record.outcome == "incomplete":
        # only a body that ran to the end passes; a record created at set-up stays "incomplete" when
        # the run is interrupted inside the body (time limit, Ctrl-C), which then writes no call report
        record.outcome = "pass"


def _backend_info(table) -> dict:
    backend = table.record.backend
    caps = backend.capabilities
    try:
        versions = dict(backend.versions())
    except Exception as exc:  # noqa: BLE001 - a report must not die on metadata
        versions = {"error": repr(exc)}
    return {"name": backend.name, "tags": sorted(backend.tags), "plugin": table.record.plugin,
            "reason": table.record.reason,
            "ops": {op: e.status for op, e in table.entries.items()},
            "routes": {op: [{"name": r.name, "available": r.available, "reason": r.reason} for r in e.routes]
                       for op, e in table.entries.items()},
            "route_overrides": table.overrides.text(),
            "capabilities": {"latent_formats": sorted(caps.latent_formats) if caps.latent_formats is not None
                             else "all",
                             "index_formats": sorted(caps.index_formats) if caps.index_formats is not None else "all",
                             "deterministic": caps.deterministic, "batch_invariant": caps.batch_invariant,
                             "distributed": caps.distributed, "unverified": dict(caps.unverified)},
            "versions": versions}


def _settings() -> dict:
    return {"max_examples": CONFIG.max_examples, "min_examples": CONFIG.min_examples, "derandomize": CONFIG.derandomize, "seed": CONFIG.seed,
            "ops": sorted(CONFIG.ops) if CONFIG.ops else "all", "device": _STATE.device if _STATE else CONFIG.device,
            "compile_budget": os.environ.get("DSAHAL_TRITON_COMPILE_BUDGET") or "off"}


def pytest_sessionfinish(session, exitstatus) -> None:
    if _STATE is None:
        return
    from dsahal.conformance import distributed
    from dsahal.ops.catalog import OP_NAMES

    distributed.shutdown_pool()
    records = list(_STATE.records.values())
    if CONFIG.report_dir and _STATE.table is not None:
        out = Path(CONFIG.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        info = _backend_info(_STATE.table)
        report.write_json(out / "conformance.json", records, info, _settings())
        report.write_markdown(out / "conformance.md", records, info, _settings(), OP_NAMES)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    global _STATE
    if _STATE is None:
        return
    from dsahal.ops.catalog import OP_NAMES
    from dsahal.registry import reset

    records = list(_STATE.records.values())
    tr = terminalreporter
    tr.section(f"dsahal conformance: backend {_STATE.table.name!r}")
    table = report.matrix(records)
    for op in [o for o in OP_NAMES if o in table]:
        tr.write_line(f"  {op:<20} {report.op_cells(table[op])}")
    counts = report.summary(records)
    tr.write_line("  " + ", ".join(f"{counts[o]} {o}" for o in report.OUTCOMES if counts[o] or o in ("pass", "fail")))
    for record in records:
        if record.outcome in ("fail", "xpass"):
            tr.write_line(f"  FAILED {record.id}: {record.property}")
    tr.write_line(f"  settings: {_settings()}")
    if CONFIG.report_dir:
        tr.write_line(f"  reports: {CONFIG.report_dir}/conformance.json, conformance.md, junit.xml")
    _STATE = None
    reset()
