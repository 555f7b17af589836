"""The example vendor plugin (examples/dsahal-example-plugin) installs as a real package and
dsahal finds it through its entry point in the package metadata: nothing registers it by hand.

One fresh Python process per scenario, with the installed package on its sys.path."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "dsahal-example-plugin")

PROBE_SCRIPT = textwrap.dedent("""
    import json, logging, importlib.metadata as md
    import torch, dsahal
    from dsahal.reference.lse_combine import lse_combine as reference
    from dsahal.registry import active_table, registry
    messages = []
    logging.getLogger("dsahal").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: messages.append(r.getMessage())})())
    points = {ep.name: ep.value for ep in md.entry_points(group="dsahal.backends")}
    record = registry().records.get("example")
    out = {"entry_point": points.get("example"), "plugin": record and record.plugin,
           "available": record and record.available, "selected": active_table().name}
    o_parts, lse_parts = torch.randn(3, 4, 2, 8), torch.randn(3, 4, 2)
    lse_parts[0, 1] = float("-inf")
    log = dsahal.CallLog()
    dsahal.add_observer(log)
    o, lse = dsahal.ops.lse_combine(o_parts, lse_parts)
    o_ref, lse_ref = reference(o_parts, lse_parts)
    out["error"] = max((o - o_ref).abs().max().item(), (lse - lse_ref).nan_to_num(0).abs().max().item())
    out["calls_contiguous"] = [log.count("lse_combine", fallback=False), log.count("lse_combine", fallback=True)]
    strided = torch.randn(3, 4, 2, 16)[..., ::2]
    dsahal.ops.lse_combine(strided, lse_parts)
    out["calls_after_strided"] = [log.count("lse_combine", fallback=False), log.count("lse_combine", fallback=True)]
    out["messages"] = messages
    print("RESULT" + json.dumps(out))
""")


def _install(source: str, target: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", target, source], check=True, capture_output=True, timeout=300)


def _run(args, target, cwd, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    full_env.update(PYTHONPATH=target, **env)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example copied out of the tree (so no build files land there) and installed to a --target dir."""
    base = tmp_path_factory.mktemp("example")
    source = base / "dsahal-example-plugin"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = base / "site"
    _install(str(source), str(target))
    return source, target


def _result(installed, **env):
    source, target = installed
    done = _run(["-c", PROBE_SCRIPT], str(target), str(source.parent), **env)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.fixture(scope="module")
def selected(installed):
    return _result(installed, DSAHAL_BACKEND="example")


def test_backend_arrives_through_the_entry_point_in_package_metadata(selected):
    assert selected["entry_point"] == "dsahal_example.plugin"
    assert selected["plugin"] == "example" and selected["available"]


def test_selected_by_environment_it_serves_lse_combine_natively_and_correctly(selected):
    assert selected["selected"] == "example"
    assert selected["calls_contiguous"] == [1, 0]
    assert selected["error"] < 1e-5


def test_its_verifier_sends_non_contiguous_calls_to_the_reference_with_the_reason(selected):
    assert selected["calls_after_strided"] == [1, 1]
    assert any("contiguous" in m and "falling back" in m for m in selected["messages"])


def test_installing_it_does_not_change_the_default_backend(installed):
    assert _result(installed)["selected"] == "reference"


def test_the_examples_own_quick_checks_pass(installed):
    source, target = installed
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], str(target), str(source))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_example_passes_the_conformance_suite_for_its_op(installed, tmp_path):
    source, target = installed
    done = _run(["-m", "dsahal", "conformance", "--backend", "example", "--ops", "lse_combine", "--max-examples", "3",
                 "--report-dir", str(tmp_path)], str(target), str(source.parent))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    tests = json.loads((tmp_path / "conformance.json").read_text())["tests"]
    matches = next(t for t in tests if t["property"] == "lse_combine.matches_reference")
    assert matches["outcome"] == "pass" and matches["native_examples"] > 0
