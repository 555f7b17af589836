"""Errors a user can cause from the command line end in one `error:` line, never a traceback."""
import os
import subprocess
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_cli(*args, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "dsahal", *args], capture_output=True, text=True, env=full_env,
                          timeout=300)


def test_a_strict_mode_fallback_is_one_error_line():
    # the half_lse plugin serves only lse_combine: `dsahal run` needs other ops, which would fall back
    done = run_cli("run", "--batch", "1", "--prompt-len", "4", "--decode", "1",
                   env={"DSAHAL_STRICT": "1", "DSAHAL_PLUGIN_MODULES": "plugins.half_lse", "DSAHAL_BACKEND": "halflse",
                        "PYTHONPATH": TESTS_DIR})
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "DSAHAL_STRICT=1 forbids it" in errors[0] and "halflse" in errors[0]
    assert "Traceback" not in done.stderr


def test_an_unknown_route_in_the_environment_is_one_error_line_listing_the_routes():
    done = run_cli("run", "--batch", "1", "--prompt-len", "4", "--decode", "1",
                   env={"DSAHAL_ROUTES": "sparse_mla:flash"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "no route 'flash' for sparse_mla" in done.stderr and done.stderr.startswith("error:")


def test_a_malformed_setting_read_while_the_commands_import_is_one_error_line(monkeypatch, capsys):
    # DSAHAL_FAST_LAUNCH is read when a kernel module is imported, which build_parser does (importing each
    # command's module); its SettingError escaped main() as a traceback, for every command, --version included
    from dsahal import cli, kernel_launch

    monkeypatch.setenv("DSAHAL_FAST_LAUNCH", "2")
    monkeypatch.setattr(cli, "build_parser", kernel_launch.fast_launch_requested)  # what a kernel module reads
    assert cli.main(["--version"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [
        "error: DSAHAL_FAST_LAUNCH: expected one of 1/true/yes/on (on) or 0/false/no/off (off), or unset, got '2'"]


@pytest.mark.parametrize("argv, says", [
    (["run", "--batch", "abc"], "dsahal run: argument --batch: invalid int value: 'abc'"),
    (["frob"], "invalid choice: 'frob'"),
    (["plan"], "dsahal plan: the following arguments are required: --context"),
    (["conformance", "--ops", "nope"], "argument --ops: invalid choice: 'nope'"),
    (["run", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_a_usage_error_is_one_error_line_naming_the_command_and_its_help(argv, says, capsys):
    # argparse printed its whole usage block, then `dsahal run: error: ...` (not an `error:` line)
    from dsahal.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured.err
    assert lines[0].startswith("error: ") and says in lines[0] and "--help')" in lines[0]
