"""Issue 22, "plugins that fail as real vendor plugins fail": each fault is reported with backend, plugin
and cause, and never takes the other backends down. The plugins are small modules in ``tests/plugins/``
loaded through ``DSAHAL_PLUGIN_MODULES``.

Decision for a backend whose ``"module:attr"`` routes do not exist (``test_conformance_*``): when no op the
backend declares can be served because its routes fail to load, ``dsahal conformance`` exits 2 with one
``error:`` line naming each op and path and runs nothing (every property would only certify the
reference); when some of its ops load, each broken route is one ``warning:`` line and the suite runs.
"""
import logging
import os
import subprocess
import sys
import time

from dsahal import ops
from dsahal.cli import main
from dsahal.registry import active_table, registry, set_backend
from dsahal.registry import discovery

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def plugins(monkeypatch, *modules):
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", ",".join(f"plugins.{m}" for m in modules))


def run_cli(*args, env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    full_env.update(env, PYTHONPATH=TESTS_DIR)
    return subprocess.run([sys.executable, "-m", "dsahal", *args], capture_output=True, text=True, env=full_env,
                          timeout=120)


# ---------------------------------------------------------------------------- one backend name, two plugins

def test_a_vendor_plugin_declaring_a_builtin_name_keeps_the_builtin_and_reports_the_conflict(monkeypatch, caplog):
    plugins(monkeypatch, "vendor_nvidia")
    with caplog.at_level(logging.WARNING, logger="dsahal"):
        reg = registry()
    assert reg.records["nvidia"].plugin == "nvidia"  # the built-in
    (conflict,) = reg.conflicts
    assert (conflict.backend, conflict.kept, conflict.dropped) == ("nvidia", "nvidia", "plugins.vendor_nvidia")
    text = conflict.describe()
    assert "'nvidia'" in text and "'plugins.vendor_nvidia'" in text and "DSAHAL_PLUGINS" in text
    assert any(text in r.getMessage() for r in caplog.records)
    assert active_table().name == "reference"  # automatic selection still works (no GPU here)
    monkeypatch.setenv("DSAHAL_BACKEND", "reference")
    set_backend(None)
    assert active_table().name == "reference"


def test_the_allow_list_picks_the_vendor_plugin_over_the_builtin(monkeypatch):
    plugins(monkeypatch, "vendor_nvidia")
    monkeypatch.setenv("DSAHAL_PLUGINS", "plugins.vendor_nvidia")  # the remedy the conflict message names
    reg = registry()
    assert reg.records["nvidia"].plugin == "plugins.vendor_nvidia" and reg.conflicts == []
    assert "nvidia" in reg.excluded
    monkeypatch.setenv("DSAHAL_BACKEND", "nvidia")
    table = active_table()
    assert table.name == "nvidia" and table.entries["lse_combine"].status == "native"


def test_two_vendor_plugins_with_one_name_keep_the_first_and_the_allow_list_picks_the_other(monkeypatch):
    plugins(monkeypatch, "twin_a", "twin_b", "half_lse")
    reg = registry()
    assert reg.records["twin"].plugin == "plugins.twin_a"
    (conflict,) = reg.conflicts
    assert (conflict.kept, conflict.dropped, conflict.why) == ("plugins.twin_a", "plugins.twin_b",
                                                               "the first loaded is kept")
    assert reg.records["halflse"].available  # the others are untouched
    for name in ("twin", "halflse", "reference"):
        set_backend(name)
        assert active_table().name == name
    monkeypatch.setenv("DSAHAL_PLUGINS", "plugins.twin_b")
    discovery_again = discovery.discover()
    assert discovery_again.records["twin"].plugin == "plugins.twin_b"
    assert discovery_again.conflicts[0].why == "DSAHAL_PLUGINS names 'plugins.twin_b'"


def test_a_plugin_declaring_reference_never_replaces_the_oracle(monkeypatch):
    plugins(monkeypatch, "duplicate_reference")
    monkeypatch.setenv("DSAHAL_PLUGINS", "plugins.duplicate_reference")
    reg = registry()
    assert reg.records["reference"].plugin == "reference"
    assert reg.conflicts[0].dropped == "plugins.duplicate_reference" and "oracle" in reg.conflicts[0].why
    assert active_table().name == "reference"


def test_backends_lists_the_conflict_naming_backend_and_both_plugins(monkeypatch, capsys):
    plugins(monkeypatch, "twin_a", "twin_b")
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "!conflict: backend 'twin' is declared by plugins 'plugins.twin_a' and 'plugins.twin_b'" in out


# ---------------------------------------------------------------------------- bounded, lazy probes

def test_a_blocking_probe_never_runs_when_another_backend_is_selected_by_name(monkeypatch):
    import plugins.slow_probe as plugin

    plugins(monkeypatch, "slow_probe")
    monkeypatch.setenv("DSAHAL_BACKEND", "reference")
    plugin.PROBED.clear()
    start = time.monotonic()
    assert active_table().name == "reference"
    assert time.monotonic() - start < 1.5
    assert plugin.PROBED == [] and not registry().records["sleepy"].probed


def test_a_blocking_probe_is_bounded_and_reported_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(discovery, "PROBE_TIMEOUT_S", 1.0)
    plugins(monkeypatch, "slow_probe", "slow_probe_b", "eager_winner")
    start = time.monotonic()
    table = active_table()  # automatic selection probes every backend: both sleepers (priority 2000, 1500) time out
    assert time.monotonic() - start < 1.8  # in parallel: one timeout, not two
    assert table.name == "eager"
    record = registry().records["sleepy"]
    assert not record.available and "did not answer within 1 s" in record.reason and "'sleepy'" in record.reason
    assert any(f.plugin == "plugins.slow_probe" and f.stage == "probe" for f in registry().failures)


def test_backends_probes_every_backend_in_parallel_and_bounded(monkeypatch, capsys):
    monkeypatch.setattr(discovery, "PROBE_TIMEOUT_S", 1.0)
    plugins(monkeypatch, "slow_probe", "slow_probe_b", "unavailable")
    start = time.monotonic()
    assert main(["backends"]) == 0
    assert time.monotonic() - start < 1.8
    out = capsys.readouterr().out
    assert "sleepy " in out and "sleepy_b" in out and out.count("did not answer within 1 s") >= 2
    assert "no ghost accelerator found" in out  # every other probe still answered


def test_the_probe_timeout_is_two_seconds_by_default():
    assert discovery.PROBE_TIMEOUT_S == 2.0


# ---------------------------------------------------------------------------- "module:attr" that does not exist

def test_a_route_whose_path_does_not_exist_is_unavailable_naming_backend_op_and_path(monkeypatch):
    plugins(monkeypatch, "missing_paths")
    set_backend("brokenpath")
    table = active_table()
    attr = table.entries["lse_combine"]
    assert attr.status == "fallback"
    assert "plugins.missing_paths:lse_combine_kernel" in attr.reason and "'brokenpath'" in attr.reason \
        and "'lse_combine'" in attr.reason and "AttributeError" in attr.reason
    module = table.entries["topk"]
    assert "no_such_vendor_module_xyz:topk" in module.reason and "ModuleNotFoundError" in module.reason


def test_conformance_exits_2_with_one_error_line_when_the_backend_can_serve_nothing_it_declares(monkeypatch, capsys,
                                                                                               tmp_path):
    plugins(monkeypatch, "missing_paths")
    code = main(["conformance", "--backend", "brokenpath", "--report-dir", str(tmp_path), "--ops", "lse_combine"])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: backend 'brokenpath' cannot serve any op it declares")
    for fragment in ("lse_combine", "plugins.missing_paths:lse_combine_kernel", "topk", "no_such_vendor_module_xyz"):
        assert fragment in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "conformance.json").exists()  # nothing ran


def test_conformance_cli_process_prints_no_traceback_for_such_a_backend(tmp_path):
    result = run_cli("conformance", "--backend", "brokenpath", "--report-dir", str(tmp_path), "--ops", "topk",
                     env={"DSAHAL_PLUGIN_MODULES": "plugins.missing_paths"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr


def test_conformance_names_a_broken_route_of_a_backend_that_serves_other_ops(monkeypatch, capsys):
    from dsahal.cli.conformance import unloadable_routes

    plugins(monkeypatch, "partly_missing")
    error, warnings = unloadable_routes("partly")
    assert error is None
    (warning,) = warnings
    assert "'partly'" in warning and "topk" in warning and "plugins.partly_missing:topk_kernel" in warning
    assert unloadable_routes("reference") == (None, [])


# ---------------------------------------------------------------------------- nothing registered, unknown ops

def test_a_plugin_without_hookimpl_is_reported_as_loaded_with_nothing_registered(monkeypatch, capsys):
    plugins(monkeypatch, "no_hookimpl", "half_lse")
    reg = registry()
    failure = next(f for f in reg.failures if f.plugin == "plugins.no_hookimpl")
    assert failure.stage == "register" and "module loaded, nothing registered" in failure.error
    assert "lacks the @dsahal.registry.hookimpl marker" in failure.error
    assert "forgotten" not in reg.records and reg.records["halflse"].available
    assert main(["backends"]) == 0
    assert "!plugin plugins.no_hookimpl: failed at register: module loaded, nothing registered" in \
        capsys.readouterr().out


def test_unknown_op_names_are_listed_and_the_backend_still_serves_its_other_ops(monkeypatch, capsys):
    plugins(monkeypatch, "unknown_op", "half_lse")
    reg = registry()
    failure = next(f for f in reg.failures if f.plugin == "plugins.unknown_op")
    assert "'lse_combin' (did you mean 'lse_combine'?)" in failure.error and "'typo'" in failure.error
    assert reg.records["halflse"].available
    set_backend("typo")
    table = active_table()
    assert table.entries["topk"].status == "native" and table.entries["lse_combine"].status == "fallback"
    assert ops.topk(*_topk_args()).shape == (2, 3)
    assert main(["backends"]) == 0
    assert "unknown op name(s) 'lse_combin'" in capsys.readouterr().out


def _topk_args():
    import torch

    return torch.randn(2, 10), torch.tensor([10, 4], dtype=torch.int32), 3


# ---------------------------------------------------------------------------- DSAHAL_PLUGINS typo

def test_an_allow_list_entry_naming_no_plugin_is_a_warning_listing_the_known_plugins(monkeypatch, caplog, capsys):
    monkeypatch.setenv("DSAHAL_PLUGINS", "nvida,amd")
    with caplog.at_level(logging.WARNING, logger="dsahal"):
        reg = registry()
    assert reg.unknown_allowed == ["nvida"]
    (message,) = [r.getMessage() for r in caplog.records if "DSAHAL_PLUGINS" in r.getMessage()]
    assert "'nvida'" in message and "did you mean 'nvidia'?" in message
    for name in ("reference", "nvidia", "amd", "tpu", "ppu"):
        assert name in message
    assert set(reg.records) == {"reference", "amd"}  # the valid entry still applies
    assert main(["backends"]) == 0
    assert "?DSAHAL_PLUGINS: no plugin is named 'nvida'" in capsys.readouterr().out


def test_the_warning_is_printed_by_the_cli(tmp_path):
    result = run_cli("backends", env={"DSAHAL_PLUGINS": "nvida"})
    assert result.returncode == 0, result.stderr
    assert "no plugin is named 'nvida'" in result.stderr and "known plugins:" in result.stderr
