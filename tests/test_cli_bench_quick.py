"""`dsahal bench --quick`: the bench harness on the CPU at tiny shapes against the reference (the path CI
can run), a backend that is off failing its check, and the command's usage errors."""
import json

import pytest

import dsahal.registry
from dsahal.bench.quick import SECTIONS, run_quick, tiny_op_cases
from dsahal.cli import main

TIMED_OPS = {"indexer_score", "topk", "sparse_mla", "lse_combine", "kda_decode", "kda_prefill", "dsa_attention"}


def test_quick_runs_every_op_on_the_cpu_checks_it_and_times_it(tmp_path, capsys):
    path = tmp_path / "quick.json"
    assert main(["bench", "--quick", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "backend reference on the CPU" in captured.out and "Traceback" not in captured.err
    checks = len(tiny_op_cases()) + len(json.loads(path.read_text())["sections"]["dispatch"])
    assert f"{checks} of {checks} checks passed" in captured.out
    rows = json.loads(path.read_text())["sections"]["ops"]
    assert {r["op"] for r in rows} == TIMED_OPS | {"cache_write"}
    for row in rows:
        assert row["check"] == "pass", row
        if row["op"] in TIMED_OPS:  # timed after the check: a positive median, and the plain-torch one
            assert row["ms"] > 0, row
    assert all(r["baseline_ms"] > 0 for r in rows if r["op"] in TIMED_OPS - {"kda_prefill"})


def test_a_backend_that_is_off_fails_its_check_is_not_timed_and_exits_1(capsys, monkeypatch):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "test_run_cli")  # "skewed": sparse MLA outputs x 1.05
    dsahal.registry.reset()
    assert main(["bench", "--quick", "--backend", "skewed", "--op", "sparse_mla"]) == 1
    out = capsys.readouterr().out
    assert "| sparse MLA bf16 | 8 tok, H=16, k=256 | FAIL: o rel err" in out
    assert "FAILED sparse MLA bf16" in out and "0 of 1 checks passed" in out


def test_sections_run_in_order_and_an_unknown_one_is_named():
    seen = []
    results = run_quick("reference", ops=["lse_combine"], on_section=seen.append)
    assert seen == list(SECTIONS) and [r.op for r in results["ops"]] == ["lse_combine"]
    with pytest.raises(ValueError, match="argument '--section' expected one of"):
        run_quick("reference", sections=["nope"])


@pytest.mark.parametrize("args, message", [
    (["--section", "nope"], "argument '--section' expected one of ops, dispatch, got nope"),
    (["--op", "model"], "argument '--op' expected ops with a --quick case"),
    (["--plot", "x.png"], "argument '--plot' applies to the GPU bench, not to --quick"),
    (["--backend", "nope"], "argument '--backend': unknown backend 'nope'"),
])
def test_quick_usage_errors_name_the_flag_on_one_error_line(args, message, capsys):
    assert main(["bench", "--quick", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dsahal bench") and message in err
    assert err.count("error:") == 1 and "Traceback" not in err


def test_the_gpu_bench_on_a_cpu_machine_says_so_in_a_whole_sentence(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA/ROCm device visible to torch, and torch sees none" in err
    assert "dsahal bench --quick" in err and err.count("\n") == 1


def test_the_dispatch_section_times_every_layer_above_the_route(tmp_path):
    results = run_quick("reference", sections=["dispatch"])
    layers = [row.name for row in results["dispatch"]]
    assert layers[:2] == ["dispatch: dsahal.ops.lse_combine (validated)", "dispatch: dsahal.ops.lse_combine(check=False)"]
    assert any("route 'reference' function" in name for name in layers)
    assert all(row.ms is not None and row.ms > 0 for row in results["dispatch"])
