"""The on/off environment flags (dsahal.registry.settings): one parser, a clear error for any other value.

Before it, each flag was "set and not 0": DSAHAL_BATCH_INVARIANT=false turned batch-invariant mode on, and
DSAHAL_STRICT=off made every fallback an error; a mistyped DSAHAL_ROUTES or flag reached `dsahal backends` silently.
"""

import os

import pytest
import torch

import dsahal
from dsahal.registry import settings
from dsahal.registry.settings import SettingError, env_flag
from test_cli_errors import run_cli

FLAG = "DSAHAL_TEST_FLAG"


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_on_values(monkeypatch, raw):
    monkeypatch.setenv(FLAG, raw)
    assert env_flag(FLAG) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "OFF", " 0 "])
def test_off_values(monkeypatch, raw):
    monkeypatch.setenv(FLAG, raw)
    assert env_flag(FLAG, default=True) is False


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_unset_or_empty_keeps_the_default(monkeypatch, raw):
    if raw is None:
        monkeypatch.delenv(FLAG, raising=False)
    else:
        monkeypatch.setenv(FLAG, raw)
    assert env_flag(FLAG) is False and env_flag(FLAG, default=True) is True


@pytest.mark.parametrize("raw", ["maybe", "2", "-1", "enable", "y"])
def test_any_other_value_is_an_error_naming_the_variable_and_the_value(monkeypatch, raw):
    monkeypatch.setenv(FLAG, raw)
    with pytest.raises(SettingError, match=rf"{FLAG}: expected one of 1/true/yes/on .* got {raw!r}"):
        env_flag(FLAG)


def test_batch_invariant_false_is_off(monkeypatch):
    from dsahal.backends.batch_mode import invariant_requested

    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "false")
    assert invariant_requested() is False
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "on")
    assert invariant_requested() is True


def test_strict_off_is_not_strict(monkeypatch):
    monkeypatch.setenv("DSAHAL_STRICT", "off")
    assert dsahal.registry.active_table().strict is False
    dsahal.registry.reset()
    monkeypatch.setenv("DSAHAL_STRICT", "true")
    assert dsahal.registry.active_table().strict is True


def test_ppu_triton_flag_reads_the_same_values(monkeypatch):
    from dsahal.backends.ppu.routes import triton_enabled

    monkeypatch.setenv("DSAHAL_PPU_TRITON", "no")
    assert triton_enabled() == (False, "DSAHAL_PPU_TRITON=no")
    monkeypatch.setenv("DSAHAL_PPU_TRITON", "sometimes")
    with pytest.raises(SettingError, match="DSAHAL_PPU_TRITON"):
        triton_enabled()


@pytest.mark.parametrize("name, raw", [("DSAHAL_STRICT", "maybe"), ("DSAHAL_BATCH_INVARIANT", "2"),
                                       ("DSAHAL_ROUTES", "sparse_mla")])
def test_a_bad_setting_stops_the_first_op_call_with_its_name(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(dsahal.registry.RegistryError, match=name):
        dsahal.ops.lse_combine(torch.randn(2, 1, 2, 512), torch.randn(2, 1, 2))


def test_check_environment_reads_every_flag(monkeypatch):
    for name in settings.FLAGS:
        monkeypatch.delenv(name, raising=False)
    settings.check_environment()
    for name in settings.FLAGS:
        monkeypatch.setenv(name, "bogus")
        with pytest.raises(SettingError, match=name):
            settings.check_environment()
        monkeypatch.delenv(name)


@pytest.mark.parametrize("env, expected", [
    ({"DSAHAL_BATCH_INVARIANT": "enabled"}, "DSAHAL_BATCH_INVARIANT: expected one of"),
    ({"DSAHAL_SCRATCH_MIB": "0"}, "DSAHAL_SCRATCH_MIB: expected a whole number of MiB >= 1"),
    ({"DSAHAL_ROUTES": "garbage"}, "DSAHAL_ROUTES: item 'garbage' expected 'op:route'"),
    ({"DSAHAL_ROUTES": "sparse_mla:nosuch"}, "no route 'nosuch' for sparse_mla"),
])
def test_dsahal_backends_reports_a_bad_setting_as_one_error_line(env, expected):
    done = run_cli("backends", env=env)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert len(errors) == 1 and expected in errors[0], done.stderr


@pytest.mark.parametrize("raw, mib", [(None, 512), ("", 512), ("64", 64), (" 2048 ", 2048)])
def test_the_scratch_bound_is_a_whole_number_of_mib(monkeypatch, raw, mib):
    if raw is None:
        monkeypatch.delenv(settings.SCRATCH_MIB, raising=False)
    else:
        monkeypatch.setenv(settings.SCRATCH_MIB, raw)
    assert settings.env_mib(settings.SCRATCH_MIB, 512) == mib and settings.scratch_bytes() == mib * 2**20


@pytest.mark.parametrize("raw", ["0", "-1", "1.5", "512MiB", "lots"])
def test_a_scratch_bound_it_does_not_take_is_an_error_at_start_up(monkeypatch, raw):
    monkeypatch.setenv(settings.SCRATCH_MIB, raw)
    with pytest.raises(SettingError, match=rf"DSAHAL_SCRATCH_MIB: expected a whole number of MiB >= 1, .* got {raw!r}"):
        settings.check_environment()
    assert settings.scratch_bytes() == 512 * 2**20  # (the modules importing it keep the default until then)


def test_the_long_call_bounds_read_the_scratch_bound():
    import subprocess
    import sys

    code = ("from dsahal.ops import score_ranges; from dsahal.backends.triton_kernels import partials; "
            "print(score_ranges.SCORES_BUDGET_BYTES, partials.PARTIALS_BUDGET_BYTES)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DSAHAL_SCRATCH_MIB": "64"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(64 * 2**20)] * 2
