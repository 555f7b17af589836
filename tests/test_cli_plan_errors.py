"""`dsahal plan`'s usage errors: one `error:` line naming the flag, exit 2, no traceback; a closed pipe
(`dsahal plan --json | head`) ends the command quietly."""
import json
import os
import subprocess
import sys

import pytest

from dsahal.cli import main

BASE = ["plan", "--memory-gib", "48", "--context", "1M"]


@pytest.mark.parametrize("args, message", [
    (["--context", "0"], "argument '--context' expected a whole token count >= 1"),
    (["--context", "-1M"], "argument '--context' expected a whole token count >= 1"),  # a value, not a flag
    (["--context", "1.5"], "argument '--context' expected a whole token count >= 1"),
    (["--context", "lots"], "argument '--context' expected a token count like 1000000, 128k, 1M or 1Mi"),
    (["--memory-gib", "inf"], "argument '--memory-gib' expected a finite number of GiB > 0"),
    (["--memory-gib", "nan"], "argument '--memory-gib' expected a finite number of GiB > 0"),
    (["--memory-gib", "0"], "argument '--memory-gib' expected a finite number of GiB > 0"),
    (["--memory-gib", "-4"], "argument '--memory-gib' expected a finite number of GiB > 0"),
    # finite, but its byte count is not: int(inf) raised OverflowError, a traceback
    (["--memory-gib", "1e300"], "argument '--memory-gib' expected a finite number of GiB > 0 (at least one byte, "
                                "at most 1.674e+299 GiB), got 1e+300"),
    (["--tp", "5"], "argument '--tp' expected a divisor of the kda heads (96), got 5"),
    (["--tp", "0"], "argument '--tp' expected an int >= 1, got 0"),
    (["--dcp", "0"], "argument '--dcp' expected an int >= 1, got 0"),
    (["--block-tokens", "0"], "argument '--block-tokens' expected an int >= 1, got 0"),
    (["--config", "no-such-model"], "argument '--config': unknown model config 'no-such-model'"),
])
def test_each_bad_argument_is_one_error_line_naming_the_flag(args, message, capsys):
    assert main(BASE + args) == 2  # the later --memory-gib / --context wins
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dsahal plan: "), captured.err
    assert message in lines[0]


def test_a_device_memory_whose_byte_count_overflows_is_one_error_line(capsys):
    # --device-gib 1e300 is finite, its byte count is not: int(inf) raised OverflowError, a traceback
    assert main(["plan", "--device-gib", "1e300", "--context", "1M"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["error: dsahal plan: argument '--device-gib' expected a finite number of GiB > 0 (at least one "
                     "byte, at most 1.674e+299 GiB), got 1e+300"]


def test_a_config_file_missing_a_field_names_the_flag_and_the_field(tmp_path, capsys):
    config = tmp_path / "partial.json"
    config.write_text(json.dumps({"name": "partial"}))
    assert main(BASE + ["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dsahal plan: argument '--config'") and "num_layers" in err and err.count("\n") == 1


def _cli(*args, **kwargs):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSAHAL_")}
    return subprocess.Popen([sys.executable, "-m", "dsahal", *args], env=env, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def test_from_the_shell_the_overflowing_memory_is_an_error_line_not_a_traceback():
    proc = _cli(*BASE, "--memory-gib", "inf", stdout=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert err.startswith("error: dsahal plan: argument '--memory-gib'") and "Traceback" not in err


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    read, write = os.pipe()
    os.close(read)  # like `| head` that has exited: every write to the pipe fails with EPIPE
    try:
        proc = _cli(*BASE, "--tp", "8", "--json", stdout=write)
    finally:
        os.close(write)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err and err == ""
    assert proc.returncode == 141  # 128 + SIGPIPE: what a command ended by the closed pipe reports
