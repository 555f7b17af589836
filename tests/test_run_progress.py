"""`dsahal run` says what it will do before doing it: the header first (before any allocation), then one
progress report per phase on stderr (weights, compile, prefill, decode), bars from the first step."""
import io

import pytest
import torch

import dsahal.model
from dsahal.cli import main
from dsahal.engine.progress import PhaseProgress

SMALL = ["run", "--batch", "2", "--prompt-len", "24", "--decode", "3", "--block-tokens", "16", "--chunk", "16"]


def test_the_header_comes_before_the_weights_are_allocated(monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise KeyboardInterrupt  # the user gives up while the weights are drawn
    monkeypatch.setattr(dsahal.model, "init_weights", fail)
    with pytest.raises(KeyboardInterrupt):
        main(SMALL)
    out = capsys.readouterr().out
    for fragment in ("backend  reference on cpu (float32)", "config   tiny", "cache    latent bf16",
                     "requests 2, prompt lengths [24, 18]", "memory   estimate"):
        assert fragment in out


def test_each_phase_reports_on_stderr_and_the_results_follow_the_header(capsys):
    assert main(SMALL) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines[0].startswith("weights  83 tensors drawn (seed 0) in ")
    assert lines[1].startswith("prefill  3 steps in ") and lines[2].startswith("decode   2 steps in ")
    out = captured.out
    assert out.index("memory   estimate") < out.index("prefill  42 tokens") < out.index("peak memory")


def test_progress_draws_bars_from_the_first_step(capsys):
    assert main(SMALL + ["--progress"]) == 0
    err = capsys.readouterr().err
    assert "\rprefill  [" in err and "] 1/3 steps" in err  # drawn at the first of 3 steps, not past 20
    assert "\rweights  [" in err and "\rdecode   [" in err


def test_compile_says_that_it_compiles(monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # the message, not the compiler, is tested
    assert main(SMALL + ["--compile"]) == 0
    err = capsys.readouterr().err
    assert "compile  torch.compile(fullgraph=True) of the decode step" in err
    assert err.index("prefill  3 steps") < err.index("compile  ") < err.index("decode   2 steps")


def test_a_phase_bar_redraws_in_place_and_a_log_gets_one_line():
    live, log = io.StringIO(), io.StringIO()
    bar = PhaseProgress("prefill", 4, "steps", live=True, out=live)
    bar.advance()
    bar.close()
    assert live.getvalue().startswith("\rprefill  [") and "1/4 steps" in live.getvalue()
    quiet = PhaseProgress("decode", 4, "steps", live=False, out=log)
    quiet.advance(2)
    quiet.close()
    quiet.close()  # idempotent
    assert log.getvalue().count("\n") == 1 and log.getvalue().startswith("decode   2 steps in ")
    silent = io.StringIO()
    PhaseProgress("decode", 4, "steps", enabled=False, out=silent).close()
    assert silent.getvalue() == ""


def test_drafts_that_are_never_accepted_are_explained(capsys):
    assert main(SMALL + ["--draft-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert "speculative: up to 4 prompt-lookup drafts per request per step; " in out
    assert ("no draft was proposed" in out) or ("the weights are seeded random" in out) or ("accepted" in out)
