"""`dsahal conformance` options a CI engineer gets wrong: each is one `error:` line naming the option and
exit status 2, before any test runs (no traceback, no run that publishes a misconfiguration as the backend's
result). In-process: the checks return before pytest or the --jobs children start."""
from __future__ import annotations

import pytest

from dsahal.cli import main
from dsahal.conformance import controls, jobs


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """``main(["conformance", ...])`` in a scratch folder, failing if the suite would start; returns
    (exit status, stderr lines)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DSAHAL_BACKEND", raising=False)
    monkeypatch.delenv("DSAHAL_ROUTES", raising=False)
    monkeypatch.setenv("DSAHAL_TRITON_COMPILE_BUDGET", "4")  # restored after the test (run() sets it)

    def no_run(*args, **kwargs):
        raise AssertionError("the suite started despite a usage error")

    monkeypatch.setattr(pytest, "main", no_run)
    monkeypatch.setattr(jobs, "run_jobs", no_run)

    def call(*argv: str) -> tuple[int, list[str]]:
        code = main(["conformance", "--backend", "reference", "--ops", "lse_combine", *argv])
        return code, capsys.readouterr().err.strip().splitlines()

    return call


def one_error(code: int, err: list[str], option: str) -> str:
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"error: {option}"), err
    return err[0]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_examples_below_one_is_a_usage_error(cli, value):
    # was: silently raised to 1 example per property, exit 0
    assert value in one_error(*cli("--max-examples", value), "--max-examples:")


def test_seed_with_derandomize_is_a_usage_error(cli):
    # was: the seed was ignored while the report recorded it as the run's seed
    assert "--derandomize" in one_error(*cli("--seed", "3", "--derandomize"), "--seed:")


def test_report_dir_that_is_a_file(cli, tmp_path):
    (tmp_path / "afile").write_text("x")
    one_error(*cli("--report-dir", "afile"), "--report-dir:")  # was: FileExistsError traceback
    one_error(*cli("--report-dir", "afile/sub"), "--report-dir:")  # was: NotADirectoryError traceback


def test_report_dir_whose_report_name_is_a_folder(cli, tmp_path):
    (tmp_path / "out" / "conformance.json").mkdir(parents=True)
    # was: the whole run, then IsADirectoryError at its end and no report
    assert "conformance.json" in one_error(*cli("--report-dir", "out"), "--report-dir:")


def test_undecodable_control_file(cli, tmp_path):
    (tmp_path / "skips.txt").write_bytes(b"\x00\xff\xfe garbage\n")
    # was: INTERNALERROR UnicodeDecodeError traceback
    one_error(*cli("--skips", "skips.txt"), "--skips:")
    with pytest.raises(controls.ControlFileError):  # what the plugin turns into a usage error
        controls.read_control_file(tmp_path / "skips.txt")


def test_unknown_backend_is_named_before_any_process_starts(cli, monkeypatch, capsys):
    # was: pytest's "ERROR: dsahal conformance: ..." (with --jobs: after listing and starting every part)
    code = main(["conformance", "--backend", "nosuch", "--ops", "lse_combine", "--jobs", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].startswith("error: --backend: unknown backend 'nosuch'"), err
    monkeypatch.setenv("DSAHAL_BACKEND", "nosuch")
    code = main(["conformance", "--ops", "lse_combine"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[0].startswith("error: unknown backend 'nosuch'"), err


@pytest.mark.parametrize("device", ["bogus", "cuda:99", "meta"])
def test_device_that_cannot_hold_op_arguments(cli, device):
    # was: every property failed (or errored) at set-up: a published report of the backend's failures
    assert repr(device) in one_error(*cli("--device", device), "--device:")


def test_an_op_named_twice_is_one_family(cli, monkeypatch):
    seen = {}
    monkeypatch.setattr(jobs, "run_jobs", lambda args, suite_dir: seen.setdefault("ops", args.ops) and 0)
    assert cli("--ops", "lse_combine", "lse_combine", "--jobs", "2") == (0, [])
    assert seen["ops"] == ["lse_combine"]  # was: the merged report's settings listed it twice


def test_a_control_file_path_that_is_a_folder_or_missing_says_which(cli, tmp_path):
    (tmp_path / "folder").mkdir()
    assert one_error(*cli("--xfails", "folder"), "--xfails:").endswith("expected a file, got a directory 'folder'")
    assert one_error(*cli("--skips", "gone.txt"), "--skips:").endswith("expected a file, got no such path 'gone.txt'")
