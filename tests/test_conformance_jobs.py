"""``dsahal conformance --jobs N``: the selected tests split over child processes, reports merged into
one run's; a part that fails, crashes or writes no report fails the merged run, naming its ops and
failing its unreported tests; a stopped part's unreported tests are incomplete."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dsahal.cli import build_parser, main
from dsahal.cli.conformance import conformance_dir
from dsahal.conformance import jobs, jobs_plan, report
from dsahal.ops.catalog import COLLECTIVE_OPS, OP_NAMES
from test_conformance_mutants import run_suite

SMALL = ("--ops", "positions_to_slots", "lse_combine", "--max-examples", "2")


def outcomes(payload: dict) -> dict:
    return {t["id"]: t["outcome"] for t in payload["tests"]}


def listing(tmp_path: Path, *options: str) -> list[jobs_plan.Listed]:
    """The suite's tests as ``dsahal conformance <options> --jobs N`` lists them (a child pytest)."""
    args = build_parser().parse_args(["conformance", *options])
    listed = jobs_plan.list_tests(args, conformance_dir(), tmp_path / "tests.jsonl")
    assert isinstance(listed, list), listed
    return listed


@pytest.fixture(scope="module")
def every_test(tmp_path_factory) -> list[jobs_plan.Listed]:
    return listing(tmp_path_factory.mktemp("listing"))


def ids(tests) -> list[str]:
    return [t.nodeid for t in tests]


def test_the_listing_names_every_collected_test_and_runs_none(every_test, tmp_path):
    assert {t.op for t in every_test} == set(OP_NAMES)  # every op has conformance tests
    assert all(t.selected and not t.vendor_skip for t in every_test) and len(set(ids(every_test))) == len(every_test)
    mla = next(t for t in every_test if t.nodeid == "test_sparse_mla.py::test_sparse_mla_matches_reference[latent:fp8]")
    assert (mla.op, mla.property, mla.format) == ("sparse_mla", "sparse_mla.matches_reference", "latent:fp8")
    assert not (tmp_path / "conformance.json").exists()
    skips = tmp_path / "skips.txt"
    skips.write_text("test_sparse_mla.py::test_sparse_mla_rejects_bad_input  # not yet\n")
    kept = listing(tmp_path, "--ops", "sparse_mla", "lse_combine", "-k", "bad_input", "--skips", str(skips))
    assert ids(kept) == ids(every_test)  # deselected tests are listed too, as not selected
    selected = [t for t in kept if t.selected]
    assert {t.op for t in selected} == {"sparse_mla", "lse_combine"} and all("bad_input" in t.nodeid for t in selected)
    costs = jobs_plan.estimated_costs(kept)
    mla_tests = [t for t in kept if t.op == "sparse_mla"]
    assert all(t.vendor_skip == ("rejects_bad_input" in t.nodeid) for t in mla_tests)
    assert costs[mla.nodeid] == jobs_plan.OP_WEIGHTS["sparse_mla"] / len(mla_tests)  # -k leaves a test its share
    assert all(costs[t.nodeid] == jobs_plan.VENDOR_SKIP_WEIGHT for t in mla_tests if t.vendor_skip)


def test_one_family_splits_over_every_part(tmp_path):
    listed = listing(tmp_path, "--ops", "sparse_mla")
    selected = [t for t in listed if t.selected]
    assert len(selected) >= 3 and {t.op for t in selected} == {"sparse_mla"}
    parts = jobs_plan.split_tests(listed, 3)
    assert len(parts) == 3 and all(parts)
    every = [nodeid for part in parts for nodeid in ids(part)]
    assert sorted(every) == sorted(ids(selected))  # each test in exactly one part
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_split_balances_the_cost_and_keeps_the_collectives_in_one_part(every_test):
    parts = jobs_plan.split_tests(every_test, 4)
    assert len(parts) == 4 and sorted(nodeid for p in parts for nodeid in ids(p)) == sorted(ids(every_test))
    assert sum(any(t.op in COLLECTIVE_OPS for t in p) for p in parts) == 1
    costs = jobs_plan.estimated_costs(every_test)
    startup = jobs_plan.RANK_POOL_STARTUP_WEIGHT
    loads = [sum(costs[t.nodeid] for t in p) + startup * any(t.op in COLLECTIVE_OPS for t in p) for p in parts]
    collectives = startup + sum(costs[t.nodeid] for t in every_test if t.op in COLLECTIVE_OPS)
    assert loads == sorted(loads, reverse=True) and max(loads) - min(loads) <= collectives
    assert sum(loads) == pytest.approx(sum(jobs_plan.OP_WEIGHTS.values()) + jobs_plan.RANK_POOL_STARTUP_WEIGHT)
    for part in parts:  # each part keeps the suite's order
        assert [t.index for t in part] == sorted(t.index for t in part)
    small = [t for t in every_test if t.op in ("lse_combine", "positions_to_slots")]
    assert [len(p) for p in jobs_plan.split_tests(small, 8)] == [1] * len(small)  # no more parts than tests


def test_jobs_2_merges_into_the_report_of_jobs_1(tmp_path):
    proc, merged = run_suite(tmp_path / "two", "reference", *SMALL, "--jobs", "2")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    seed = merged["settings"]["seed"]
    assert proc.stdout.count(f"seed {seed}") == 1  # drawn by the parent, printed once
    parts = [json.loads((tmp_path / "two" / "report" / "parts" / str(i) / "conformance.json").read_text())
             for i in range(2)]
    assert {p["settings"]["seed"] for p in parts} == {seed}
    assert merged["settings"]["jobs"] == 2 and merged["merge"]["problems"] == []

    proc, single = run_suite(tmp_path / "one", "reference", *SMALL, "--seed", str(seed))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert {t["op"] for t in merged["tests"]} == {"positions_to_slots", "lse_combine"}
    assert outcomes(merged) == outcomes(single) and merged["matrix"] == single["matrix"]
    assert list(outcomes(merged)) == list(outcomes(single))  # in the suite's order
    split = [part["tests"] for part in merged["merge"]["parts"]]
    assert len(split) == 2 and sorted(sum(split, [])) == sorted(outcomes(single))
    assert merged["backend"] == single["backend"]
    assert {k: v for k, v in merged["settings"].items() if k != "jobs"} == single["settings"]

    junit = ET.parse(tmp_path / "two" / "report" / "junit.xml").getroot()
    assert junit.tag == "testsuites" and len(junit.findall("testsuite")) == 2
    assert int(junit.get("tests")) == len(single["tests"]) and int(junit.get("failures")) == 0
    markdown = (tmp_path / "two" / "report" / "conformance.md").read_text()
    assert "| positions_to_slots | - | **pass** |" in markdown and "| lse_combine | - | **pass** |" in markdown


def test_a_crashed_part_fails_the_run_naming_its_ops(tmp_path):
    proc, merged = run_suite(tmp_path, "crashlse", *SMALL, "--jobs", "2", plugin="crash_lse")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    # every part holding an lse_combine test crashes (the plugin kills its process there): each is named
    named = list(re.finditer(r"part (\d) \(ops: ([a-z_, ]+); (\d+) tests?\) was killed by SIGKILL and wrote "
                             r"no conformance.json: these ops are NOT certified", output))
    assert named and all("lse_combine" in m.group(2).split(", ") for m in named), output[-3000:]
    crashed_tests = []
    for match in named:
        crashed = merged["merge"]["parts"][int(match.group(1))]
        assert crashed["status"] == "crashed" and len(crashed["tests"]) == int(match.group(3))
        crashed_tests += crashed["tests"]
    # one failing record per test of the crashed parts (they reported none), under the test's own id
    failed = [t for t in merged["tests"] if t["outcome"] == "fail"]
    assert sorted(t["id"] for t in failed) == sorted(crashed_tests)
    assert all("NOT certified" in t["message"] for t in failed) and "lse_combine" in {t["op"] for t in failed}
    assert merged["summary"]["fail"] == len(failed)
    listed = sorted(nodeid for part in merged["merge"]["parts"] for nodeid in part["tests"])
    assert sorted(t["id"] for t in merged["tests"]) == listed  # no test missing, none twice
    assert {t["op"] for t in merged["tests"]} == {"positions_to_slots", "lse_combine"}
    junit = ET.parse(tmp_path / "report" / "junit.xml").getroot()
    assert int(junit.get("failures")) == len(failed)


def listed(op: str, name: str = "t") -> jobs_plan.Listed:
    return jobs_plan.Listed(nodeid=f"test_{op}.py::{name}", op=op, property=f"{op}.p")


def fake_part(tmp_path: Path, index: int, ops: list[str], outcome: str | None, returncode: int,
              names: tuple[str, ...] = ("t",), reported: int | None = None) -> jobs_plan.Part:
    """A finished part as a child leaves it: its JSON and junit.xml (none when ``outcome`` is None);
    a test per op and name, the first ``reported`` of them with a record (default: all)."""
    tests = [listed(op, name) for op in ops for name in names]
    part = jobs_plan.Part(index, tests, tmp_path / "parts" / str(index), returncode=returncode, seconds=1.0)
    part.dir.mkdir(parents=True)
    if outcome is None:
        return part
    records = [report.TestRecord(id=t.nodeid, nodeid=t.nodeid, op=t.op, property=t.property, format="-",
                                 backend="reference", outcome=outcome, message="boom")
               for t in tests[:reported]]
    settings = {"max_examples": 2, "derandomize": False, "seed": 5, "ops": sorted(ops), "device": "cpu"}
    report.write_json(part.dir / "conformance.json", records, {"name": "reference"}, settings)
    failures = int(outcome == "fail")
    (part.dir / "junit.xml").write_text(
        f'<testsuites><testsuite name="pytest" tests="{len(ops)}" failures="{failures * len(ops)}" errors="0" '
        f'skipped="0" time="1.0"></testsuite></testsuites>')
    part.payload = report.read_json(part.dir / "conformance.json")
    return part


def finish(tmp_path: Path, parts: list[jobs_plan.Part]) -> tuple[int, dict, str]:
    args = build_parser().parse_args(["conformance", "--seed", "5", "--report-dir", str(tmp_path), "--jobs", "2"])
    code = jobs.finish(parts, args, tmp_path, 5)
    return code, report.read_json(tmp_path / "conformance.json"), (tmp_path / "conformance.md").read_text()


def test_a_part_with_a_failing_test_fails_the_merged_run(tmp_path, capsys):
    parts = [fake_part(tmp_path, 0, ["sparse_mla"], "fail", 1), fake_part(tmp_path, 1, ["topk"], "pass", 0)]
    code, merged, markdown = finish(tmp_path, parts)
    assert code == 1
    assert merged["summary"]["fail"] == 1 and merged["summary"]["pass"] == 1
    assert "## Failures" in markdown and "test_sparse_mla.py::t" in markdown
    assert "FAILED test_sparse_mla.py::t" in capsys.readouterr().out
    assert int(ET.parse(tmp_path / "junit.xml").getroot().get("failures")) == 1


def test_a_part_without_a_report_fails_the_run_naming_its_ops(tmp_path, capsys):
    # Exit status 0 but no JSON (e.g. a report directory removed under it): still never a pass.
    parts = [fake_part(tmp_path, 0, ["topk"], "pass", 0),
             fake_part(tmp_path, 1, ["kda_decode", "kda_prefill"], None, 0)]
    code, merged, markdown = finish(tmp_path, parts)
    err = capsys.readouterr().err
    assert code == 1
    assert "part 1 (ops: kda_decode, kda_prefill; 2 tests) exited with status 0 and wrote no conformance.json" in err
    failed = [t for t in merged["tests"] if t["outcome"] == "fail"]
    assert [t["id"] for t in failed] == ["test_kda_decode.py::t", "test_kda_prefill.py::t"]  # one per test
    assert "**problem**: part 1 (ops: kda_decode, kda_prefill; 2 tests)" in markdown


def test_a_stopped_parts_unreported_tests_are_incomplete(tmp_path, capsys):
    # Stopped (SIGTERM) after reporting one of its three tests; another stopped before it reported any.
    parts = [fake_part(tmp_path, 0, ["sparse_mla"], "pass", 1, names=("a", "b", "c"), reported=1),
             fake_part(tmp_path, 1, ["topk"], None, -2)]
    for part in parts:
        part.stopped = "on SIGTERM"
    code, merged, markdown = finish(tmp_path, parts)
    assert code == 1
    assert outcomes(merged) == {"test_sparse_mla.py::a": "pass", "test_sparse_mla.py::b": "incomplete",
                                "test_sparse_mla.py::c": "incomplete", "test_topk.py::t": "incomplete"}
    assert merged["summary"]["incomplete"] == 3 and merged["summary"]["fail"] == 0
    assert [p["unreported"] for p in merged["merge"]["parts"]] == [2, 1]
    err = capsys.readouterr().err
    assert ("part 0 (ops: sparse_mla; 3 tests) was stopped on SIGTERM: its report covers the tests done until "
            "then; 2 of its tests without a record are reported incomplete") in err
    assert "part 1 (ops: topk; 1 test) was stopped on SIGTERM: it left no report; 1 of its tests" in err
    assert "**3 incomplete**" in markdown and "| sparse_mla | - | **incomplete** |" in markdown
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    assert int(junit.get("errors")) == 3 and int(junit.get("failures")) == 0


def test_parts_that_disagree_on_the_backend_are_a_problem():
    base = {"tests": [], "settings": {"seed": 1, "ops": ["topk"]}}
    merged = report.merge({"part 0": {**base, "backend": {"name": "nvidia", "reason": "H200"}},
                           "part 1": {**base, "backend": {"name": "ppu", "reason": "H200"}}})
    assert merged.problems == ["backend 'name' differs between parts (part 0: 'nvidia'; part 1: 'ppu')"]


# A child that, like pytest, still writes its report when interrupted (SIGINT).
WRITES_REPORT_ON_SIGINT = """
import pathlib, sys, time
try:
    pathlib.Path(sys.argv[1]).with_name("ready").write_text("")
    time.sleep(60)
except KeyboardInterrupt:
    pathlib.Path(sys.argv[1]).write_text('{"tests": [], "summary": {}}')
    sys.exit(1)
"""


def test_exitfirst_stops_the_other_parts_and_keeps_what_they_reported(tmp_path):
    report_file = tmp_path / "1" / "conformance.json"
    parts = [jobs_plan.Part(0, [listed("topk")], tmp_path / "0",
                            command=[sys.executable, "-c", "import sys; sys.exit(1)"]),
             jobs_plan.Part(1, [listed("sparse_mla")], tmp_path / "1",
                            command=[sys.executable, "-c", WRITES_REPORT_ON_SIGINT, str(report_file)])]
    for part in parts:
        jobs.launch(part, jobs_plan.child_env(2))
    waited = 0.0
    while not (tmp_path / "1" / "ready").exists() and waited < 60:  # the second child reached its sleep
        time.sleep(0.05)                                            # (a loaded machine starts Python slowly)
        waited += 0.05
    jobs.wait_all(parts, exitfirst=True)
    assert [p.status for p in parts] == ["crashed", "stopped"]  # exit 1 without a report: crashed
    assert parts[1].payload == {"tests": [], "summary": {}} and parts[1].seconds < 30


def test_children_take_the_stop_signal_when_the_parent_ignores_sigint(tmp_path):
    """A run started in the background by a non-interactive shell (``cmd &``: CI runners, nohup) ignores
    SIGINT, and an ignored signal survives exec: the children must still get it at its default, or -x and
    SIGTERM would only ever kill them after the grace period, without their partial reports."""
    import signal

    report_file = tmp_path / "0" / "conformance.json"
    part = jobs_plan.Part(0, [listed("sparse_mla")], tmp_path / "0",
                          command=[sys.executable, "-c", WRITES_REPORT_ON_SIGINT, str(report_file)])
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        jobs.launch(part, jobs_plan.child_env(2))
    finally:
        signal.signal(signal.SIGINT, previous)
    waited = 0.0
    while not (tmp_path / "0" / "ready").exists() and waited < 60:
        time.sleep(0.05)
        waited += 0.05
    started = time.monotonic()
    jobs.stop_all([part], "test")
    assert part.process.returncode == 1 and time.monotonic() - started < jobs.STOP_GRACE_S
    assert report_file.read_text() == '{"tests": [], "summary": {}}'


def test_sigterm_stops_the_parts_and_still_writes_the_merged_report(tmp_path):
    command = [sys.executable, "-m", "dsahal", "conformance", "--backend", "reference", "--jobs", "2",
               "--ops", "sparse_mla", "cache_write", "--max-examples", "1000", "--report-dir", str(tmp_path)]
    parent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in parent.stdout:
        if line.startswith("  part 1 "):
            break
    time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)
    output = line + parent.stdout.read()
    assert parent.wait(timeout=60) == 1, output
    merged = json.loads((tmp_path / "conformance.json").read_text())
    assert [p["status"] for p in merged["merge"]["parts"]] == ["stopped", "stopped"]
    assert re.search(r"part 0 \(ops: [a-z_, ]+; \d+ tests\) was stopped on SIGTERM", output), output
    # every test of the parts is in the report; those no child reported are incomplete, never missing
    listed = sorted(nodeid for part in merged["merge"]["parts"] for nodeid in part["tests"])
    assert sorted(t["id"] for t in merged["tests"]) == listed
    assert merged["summary"]["incomplete"] >= sum(p["unreported"] for p in merged["merge"]["parts"]) > 0


def test_jobs_must_be_positive(capsys):
    assert main(["conformance", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_child_command_passes_every_option_through():
    args = build_parser().parse_args(["conformance", "--backend", "nvidia", "--skips", "s.txt", "--xfails", "x.txt",
                                      "--max-examples", "3", "--min-examples", "2", "--derandomize", "--device",
                                      "cuda:0", "-k", "mla", "--compile-budget", "7",
                                      "-x", "-v", "--jobs", "4"])
    command = jobs_plan.child_command(args, ["sparse_mla"], Path("r/parts/0"), None, Path("r/parts/0/tests.txt"))
    assert command[1:] == ["-m", "dsahal", "conformance", "--ops", "sparse_mla", "--tests", "r/parts/0/tests.txt",
                           "--report-dir", "r/parts/0",
                           "--backend", "nvidia", "--skips", "s.txt", "--xfails", "x.txt", "--max-examples", "3",
                           "--min-examples", "2", "--compile-budget", "7", "--device", "cuda:0", "-k", "mla", "--derandomize", "--exitfirst", "--verbose"]
    reparsed = build_parser().parse_args(command[3:])
    assert reparsed.jobs == 1 and reparsed.ops == ["sparse_mla"] and reparsed.tests == "r/parts/0/tests.txt"
    listing_command = " ".join(jobs_plan.list_command(args, Path("suite"), Path("t.jsonl")))
    assert " -m pytest suite --rootdir suite " in listing_command and "--collect-only --dsahal-list-tests t.jsonl" \
        in listing_command and listing_command.endswith("--dsahal-skips s.txt --dsahal-xfails x.txt -k mla")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_listed_test_that_is_not_collected_is_one_error_line(tmp_path, jobs):
    tests = tmp_path / "tests.txt"
    tests.write_text("test_lse_combine.py::test_lse_combine_matches_reference\ntest_lse_combine.py::no_such_test\n")
    proc, report = run_suite(tmp_path, "reference", "--tests", str(tests), "--max-examples", "1", "--jobs", jobs)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout == "" and not report  # nothing ran
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --tests: {tests}: 1 listed test id(s) name no test of "
                                                   f"the conformance suite: test_lse_combine.py::no_such_test ("), lines


def test_the_suites_own_option_rejects_a_test_it_did_not_collect(tmp_path):
    """Run as plain pytest (a vendor's CI): ``--dsahal-tests`` with an unknown id is pytest's usage error."""
    tests = tmp_path / "tests.txt"
    tests.write_text("test_lse_combine.py::no_such_test\n")
    suite = conformance_dir()
    command = [sys.executable, "-m", "pytest", str(suite), "--rootdir", str(suite), "-p", "no:cacheprovider", "-q",
               "--collect-only", "--dsahal-tests", str(tests)]
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):  # (as the CLI's own command adds it)
        command += ["-p", "dsahal.conformance.plugin"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, (proc.stdout + proc.stderr)[-3000:]
    assert "1 listed test(s) not collected: test_lse_combine.py::no_such_test" in proc.stdout + proc.stderr


def test_children_get_the_environment_and_a_share_of_the_threads(monkeypatch):
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    monkeypatch.setenv("DSAHAL_AMD_PATHS", "triton")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = jobs_plan.child_env(64)
    assert env["DSAHAL_BATCH_INVARIANT"] == "1" and env["DSAHAL_AMD_PATHS"] == "triton"
    assert env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert jobs_plan.child_env(2)["OMP_NUM_THREADS"] == "7"  # the user's choice wins


def test_a_property_interrupted_inside_its_body_is_incomplete_not_passed(tmp_path):
    proc, payload = run_suite(tmp_path, "interruptlse", "--ops", "lse_combine", "--max-examples", "2",
                              plugin="interrupt_lse")
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    states = outcomes(payload)
    interrupted = [test for test, outcome in states.items() if outcome == "incomplete"]
    assert len(interrupted) == 1 and "pass" not in states.values(), states
    assert payload["summary"]["incomplete"] == 1
    markdown = (tmp_path / "report" / "conformance.md").read_text()
    assert "| lse_combine | - | **incomplete** |" in markdown and "1 incomplete" in markdown


def test_min_examples_is_a_floor_under_every_property_budget(tmp_path):
    """Scaled properties (the bad-input ones run a fifth of the budget) run at least --min-examples."""
    proc, payload = run_suite(tmp_path, "reference", "--ops", "lse_combine", "--max-examples", "5",
                              "--min-examples", "4")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert payload["settings"]["min_examples"] == 4
    counts = {t["id"]: t["examples"] for t in payload["tests"] if t["outcome"] == "pass"}
    assert counts and min(counts.values()) >= 4, counts
