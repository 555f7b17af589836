"""scripts/h200/model_check.py: the table, and one error line with exit 1 when a layout fails."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "h200" / "model_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("model_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_layout_loads_and_passes_on_the_cpu(capsys, monkeypatch):
    script = load_script()
    every = script.layouts()
    assert [name for name, _, _ in every] == ["deepseek-v3.2 bf16", "deepseek-v3.2 fp8", "k3-hybrid bf16",
                                              "k3-hybrid fp8"]
    monkeypatch.setattr(script, "layouts", lambda: [every[3]])  # the hybrid in FP8: KDA convs, MoE, scales
    assert script.main(["--cpu-smoke"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("k3-hybrid fp8"))
    assert row.split()[2:4] == ["reference", "8"] and row.endswith("pass")


def test_a_failing_layout_exits_1_with_one_error_line(capsys, monkeypatch):
    script = load_script()
    every = script.layouts()
    monkeypatch.setattr(script, "layouts", lambda: every[:1])
    assert script.main(["--cpu-smoke", "--backend", "no-such-backend"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out and "without a report" in captured.out
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: model_check: 1 of 1 layouts failed") and \
        "deepseek-v3.2 bf16" in err[0]
