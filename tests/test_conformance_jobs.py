"""``dsahal conformance --jobs N``: op families split over child processes, reports merged into one
run's; a part that fails, crashes or writes no report fails the merged run, naming its ops."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from dsahal.cli import build_parser, main
from dsahal.cli import conformance_jobs as jobs
from dsahal.conformance import report
from dsahal.ops.catalog import COLLECTIVE_OPS, OP_NAMES
from test_conformance_mutants import run_suite

SMALL = ("--ops", "positions_to_slots", "lse_combine", "--max-examples", "2")


def outcomes(payload: dict) -> dict:
    return {t["id"]: t["outcome"] for t in payload["tests"]}


def test_split_balances_the_weight_and_keeps_the_collectives_in_one_group():
    groups = jobs.split_ops(list(OP_NAMES), 4)
    assert len(groups) == 4 and sorted(op for g in groups for op in g) == sorted(OP_NAMES)
    assert sum(any(op in g for op in COLLECTIVE_OPS) for g in groups) == 1
    loads = [sum(jobs.OP_WEIGHTS[op] for op in g) for g in groups]
    assert max(loads) - min(loads) <= max(jobs.OP_WEIGHTS.values()) / 2
    assert jobs.split_ops(["lse_combine", "positions_to_slots"], 8) == [["positions_to_slots"], ["lse_combine"]]


def test_every_op_has_conformance_tests():
    from dsahal.cli.conformance import conformance_dir

    assert jobs.ops_with_tests(conformance_dir()) == list(OP_NAMES)


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
    assert "(ops: lse_combine) was killed by SIGKILL and wrote no conformance.json" in output
    assert merged["summary"]["fail"] == 1
    failed = [t for t in merged["tests"] if t["outcome"] == "fail"]
    assert [t["op"] for t in failed] == ["lse_combine"] and "NOT certified" in failed[0]["message"]
    assert {t["op"] for t in merged["tests"]} == {"positions_to_slots", "lse_combine"}
    junit = ET.parse(tmp_path / "report" / "junit.xml").getroot()
    assert int(junit.get("failures")) == 1


def fake_part(tmp_path: Path, index: int, ops: list[str], outcome: str | None, returncode: int) -> jobs.Part:
    """A finished part as a child leaves it: its JSON and junit.xml (none when ``outcome`` is None)."""
    part = jobs.Part(index, ops, tmp_path / "parts" / str(index), returncode=returncode, seconds=1.0)
    part.dir.mkdir(parents=True)
    if outcome is None:
        return part
    records = [report.TestRecord(id=f"test_{op}.py::t", nodeid=f"test_{op}.py::t", op=op, property=f"{op}.p",
                                 format="-", backend="reference", outcome=outcome, message="boom")
               for op in ops]
    settings = {"max_examples": 2, "derandomize": False, "seed": 5, "ops": sorted(ops), "device": "cpu"}
    report.write_json(part.dir / "conformance.json", records, {"name": "reference"}, settings)
    failures = int(outcome == "fail")
    (part.dir / "junit.xml").write_text(
        f'<testsuites><testsuite name="pytest" tests="{len(ops)}" failures="{failures * len(ops)}" errors="0" '
        f'skipped="0" time="1.0"></testsuite></testsuites>')
    part.payload = report.read_json(part.dir / "conformance.json")
    return part


def finish(tmp_path: Path, parts: list[jobs.Part]) -> tuple[int, dict, str]:
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
    parts = [fake_part(tmp_path, 0, ["topk"], "pass", 0), fake_part(tmp_path, 1, ["kda_decode", "kda_prefill"], None, 0)]
    code, merged, markdown = finish(tmp_path, parts)
    err = capsys.readouterr().err
    assert code == 1
    assert "part 1 (ops: kda_decode, kda_prefill) exited with status 0 and wrote no conformance.json" in err
    assert {t["op"] for t in merged["tests"] if t["outcome"] == "fail"} == {"kda_decode", "kda_prefill"}
    assert "**problem**: part 1 (ops: kda_decode, kda_prefill)" in markdown


def test_parts_that_disagree_on_the_backend_are_a_problem():
    base = {"tests": [], "settings": {"seed": 1, "ops": ["topk"]}}
    merged = report.merge({"part 0": {**base, "backend": {"name": "nvidia", "reason": "H200"}},
                           "part 1": {**base, "backend": {"name": "ppu", "reason": "H200"}}})
    assert merged.problems == ["backend 'name' differs between parts (part 0: 'nvidia'; part 1: 'ppu')"]


# A child that, like pytest, still writes its report when interrupted (SIGINT).
WRITES_REPORT_ON_SIGINT = """
import pathlib, sys, time
try:
    time.sleep(60)
except KeyboardInterrupt:
    pathlib.Path(sys.argv[1]).write_text('{"tests": [], "summary": {}}')
    sys.exit(1)
"""


def test_exitfirst_stops_the_other_parts_and_keeps_what_they_reported(tmp_path):
    report_file = tmp_path / "1" / "conformance.json"
    parts = [jobs.Part(0, ["topk"], tmp_path / "0", command=[sys.executable, "-c", "import sys; sys.exit(1)"]),
             jobs.Part(1, ["sparse_mla"], tmp_path / "1",
                       command=[sys.executable, "-c", WRITES_REPORT_ON_SIGINT, str(report_file)])]
    for part in parts:
        jobs.launch(part, jobs.child_env(2))
    time.sleep(1.0)  # let the second child reach its sleep
    jobs.wait_all(parts, exitfirst=True)
    assert [p.status for p in parts] == ["crashed", "stopped"]  # exit 1 without a report: crashed
    assert parts[1].payload == {"tests": [], "summary": {}} and parts[1].seconds < 30


def test_sigterm_stops_the_parts_and_still_writes_the_merged_report(tmp_path):
    command = [sys.executable, "-m", "dsahal", "conformance", "--backend", "reference", "--jobs", "2",
               "--ops", "sparse_mla", "cache_write", "--max-examples", "1000", "--report-dir", str(tmp_path)]
    parent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in parent.stdout:
        if line.startswith("  part 1:"):
            break
    time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)
    output = line + parent.stdout.read()
    assert parent.wait(timeout=60) == 1, output
    merged = json.loads((tmp_path / "conformance.json").read_text())
    assert [p["status"] for p in merged["merge"]["parts"]] == ["stopped", "stopped"]
    assert "(ops: sparse_mla) was stopped on SIGTERM" in output


def test_jobs_must_be_positive(capsys):
    assert main(["conformance", "--jobs", "0"]) == 2
    assert "--jobs" in capsys.readouterr().err


def test_child_command_passes_every_option_through():
    args = build_parser().parse_args(["conformance", "--backend", "nvidia", "--skips", "s.txt", "--xfails", "x.txt",
                                      "--max-examples", "3", "--derandomize", "--device", "cuda:0", "-k", "mla",
                                      "-x", "-v", "--jobs", "4"])
    command = jobs.child_command(args, ["sparse_mla"], Path("r/parts/0"), None)
    assert command[1:] == ["-m", "dsahal", "conformance", "--ops", "sparse_mla", "--report-dir", "r/parts/0",
                           "--backend", "nvidia", "--skips", "s.txt", "--xfails", "x.txt", "--max-examples", "3",
                           "--device", "cuda:0", "-k", "mla", "--derandomize", "--exitfirst", "--verbose"]
    reparsed = build_parser().parse_args(command[3:])
    assert reparsed.jobs == 1 and reparsed.ops == ["sparse_mla"]


def test_children_get_the_environment_and_a_share_of_the_threads(monkeypatch):
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    monkeypatch.setenv("DSAHAL_AMD_PATHS", "triton")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    env = jobs.child_env(64)
    assert env["DSAHAL_BATCH_INVARIANT"] == "1" and env["DSAHAL_AMD_PATHS"] == "triton"
    assert env["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert jobs.child_env(2)["OMP_NUM_THREADS"] == "7"  # the user's choice wins


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
