"""The `dsahal` command: backends table, version, help, errors."""
import json
import os
import subprocess
import sys

import pytest

from dsahal import __version__
from dsahal.cli import build_parser, main
from dsahal.ops.catalog import OP_NAMES


def run_cli(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "dsahal", *args], capture_output=True, text=True, env=full_env,
                          timeout=120)


def test_backends_lists_every_builtin_with_availability_and_reason():
    result = run_cli("backends")
    assert result.returncode == 0, result.stderr
    for name in ("reference", "nvidia", "amd", "tpu", "ppu"):
        assert f" {name}" in result.stdout
    assert "no CUDA device visible" in result.stdout
    assert "selected: reference" in result.stdout


def test_backends_columns_line_up_with_a_long_backend_name():
    result = run_cli("backends", env={"DSAHAL_PLUGIN_MODULES": "dsahal.backends.ppu.cpu_twin"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    column = lines[0].index("available")
    rows = [line for line in lines[1:] if line[1:].split(" ")[0] in ("reference", "ppu-cpu-twin", "nvidia")]
    assert len(rows) == 3, result.stdout
    for line in rows:
        assert line[column:].split()[0] in ("yes", "no"), line  # the availability column under its header


def test_backends_json_reports_coverage_per_op():
    result = run_cli("backends", "--json")
    data = json.loads(result.stdout)
    rows = {row["name"]: row for row in data["backends"]}
    assert data["selected"] == "reference"
    assert set(rows["reference"]["coverage"].values()) == {"native"}
    assert rows["amd"]["available"] is False and "ROCm" in rows["amd"]["reason"]


def test_unknown_backend_in_env_exits_nonzero_naming_the_backends():
    result = run_cli("backends", env={"DSAHAL_BACKEND": "nope"})
    assert result.returncode != 0
    assert "unknown backend 'nope'" in result.stderr
    for name in ("reference", "nvidia", "amd", "tpu", "ppu"):
        assert name in result.stderr


def test_installed_plugin_appears_in_the_table():
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    result = run_cli("backends", "--verbose", env={"DSAHAL_PLUGIN_MODULES": "plugins.half_lse",
                                                   "PYTHONPATH": tests_dir})
    assert "halflse" in result.stdout
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(" halflse") or line.startswith("*halflse"))
    routes = lines[at:at + 8]
    assert any(line.strip() == "lse_combine:" for line in routes), routes
    assert any(line.split()[:2] == ["on", "default"] for line in routes), routes  # its one route, usable


def test_verbose_lists_the_reference_routes_as_usable():
    # the reference is always available and serves every op itself: its routes were listed as
    # "not resolved: backend unavailable" under `dsahal backends --verbose`
    from dsahal.cli.backends import route_rows
    from dsahal.registry import registry

    reg = registry()
    rows = route_rows(reg.records["reference"], reg)
    assert set(rows) == set(OP_NAMES)
    for op, routes in rows.items():
        assert [(r["name"], r["available"]) for r in routes] == [("reference", True)], (op, routes)
        assert "unavailable" not in routes[0]["reason"]


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_no_command_is_one_error_line_naming_the_commands(capsys):
    from dsahal.cli import main

    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("error: dsahal: a COMMAND is required, one of ")
    for command in ("backends", "run", "conformance", "bench"):
        assert command in err


def test_every_command_has_help(capsys):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # argparse keeps sub-parsers here
    assert "backends" in commands
    for name in commands:
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0
        assert "usage: dsahal " + name in capsys.readouterr().out


def test_run_help_names_every_preset(capsys, monkeypatch):
    # `dsahal run --help` named three presets (tiny, k31-pro-slice, k31-pro) of the five shipped
    from dsahal.config import list_presets

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at hyphens otherwise
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for preset in list_presets():
        assert preset + "," in text or preset + ";" in text, preset
