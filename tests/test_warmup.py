"""The compile warm-up (dsahal.engine.warmup): it runs the attention ops of the first prefill and decode steps
on dummy inputs, leaves no trace in the cache, the RNG or the generated tokens, is skipped where it compiles
nothing (reference backend, CPU) or when asked (--no-warmup), and `dsahal run` reports it and its first token."""
import json

import pytest
import torch

import dsahal.engine.warmup as warmup
from dsahal.cli import main
from dsahal.engine import OpTimer
from dsahal.engine.warmup import first_prefill_step, skip_reason, warm_up
from dsahal.model import LocalDsaAttention
from test_model_helpers import greedy_requests, random_prompts, small_engine, small_model

LENGTHS = [30, 21, 9]  # chunk 24: the first step is 24 tokens of request 0 alone; decode has 3 requests
NEW_TOKENS = 3
SMALL = ["run", "--batch", "2", "--prompt-len", "24", "--decode", "3", "--block-tokens", "16", "--chunk", "16"]


@pytest.fixture(scope="module")
def model():
    return small_model()


def engine_for(model):
    return small_engine(model, max_batch=3, max_context=64, chunk=24)


def test_the_first_prefill_step_is_packed_as_the_engine_packs_it(model):
    for lengths, chunk in (([30, 21, 9], 24), ([5, 3, 9], 24), ([8, 8], 16), ([40], 16)):
        engine = small_engine(model, max_batch=3, max_context=64, chunk=chunk)
        for request in greedy_requests(random_prompts(lengths, model.config.vocab_size), 2):
            engine.add(request)
        engine._admit()
        scheduled, decode = engine._schedule()
        assert not decode
        assert first_prefill_step(lengths, 3, chunk) == [count for _, count in scheduled], (lengths, chunk)


def test_it_runs_the_prefill_and_decode_ops_and_leaves_cache_and_rng_as_they_were(model):
    engine = engine_for(model)
    engine.cache.pool.random_(0, 256, generator=torch.Generator().manual_seed(3))  # not zeros: a lost write shows
    before, rng = engine.cache.pool.clone(), torch.get_rng_state()
    with OpTimer() as timer:  # one thread: the timer's call stack is per process
        result = warm_up(engine, LENGTHS, show=False, force=True, max_threads=1)
    assert result.errors == [] and result.skipped == "" and result.seconds > 0
    assert result.jobs == ["KDA prefill", "KDA decode", "DSA prefill", "DSA decode", "sparse MLA prefill",
                           "sparse MLA decode"]
    calls = {row["op"]: row["calls"] for row in timer.rows()}
    # 2 KDA jobs (prefill, decode), the one DSA layer's prefill and decode, 2 lone sparse MLA calls
    assert calls["kda_prefill"] == 1 and calls["kda_decode"] == 1
    assert calls["dsa_attention"] == 2 and calls["sparse_mla"] >= 2
    assert calls["cache_write"] == 4  # latent and index key of the DSA layer, prefill and decode
    assert torch.equal(engine.cache.pool, before), "the warm-up left bytes in the cache"
    assert torch.equal(torch.get_rng_state(), rng), "the warm-up drew from the global RNG"
    assert engine.stats.prefill_steps == 0 and list(engine.free_rows) == [0, 1, 2] and not engine.running


def test_with_the_fused_glue_on_for_eager_steps_it_also_runs_whole_blocks_and_leaves_no_trace(model):
    """fused.enable_by_default(): the KDA jobs run whole blocks and two DSA glue jobs run the DSA block around a
    stand-in attention (no cache write, no attention call of their own); still no byte of the cache changes."""
    from dsahal.model import fused

    engine = engine_for(model)
    engine.cache.pool.random_(0, 256, generator=torch.Generator().manual_seed(4))
    before = engine.cache.pool.clone()
    fused.enable_by_default(True)
    try:
        with OpTimer() as timer:
            result = warm_up(engine, LENGTHS, show=False, force=True, max_threads=1)
    finally:
        fused.enable_by_default(False)
    assert result.errors == [] and result.skipped == ""
    assert result.jobs == ["KDA prefill", "KDA decode", "DSA prefill", "DSA decode", "DSA glue prefill",
                           "DSA glue decode", "sparse MLA prefill", "sparse MLA decode"]
    calls = {row["op"]: row["calls"] for row in timer.rows()}
    assert calls["dsa_attention"] == 2 and calls["cache_write"] == 4  # the glue jobs add none
    assert torch.equal(engine.cache.pool, before), "the warm-up left bytes in the cache"
    assert not fused.on_by_default()


def test_tokens_and_logits_are_the_same_with_and_without_the_warm_up(model):
    prompts = random_prompts(LENGTHS, model.config.vocab_size, seed=5)
    cold = engine_for(model).run(greedy_requests(prompts, NEW_TOKENS))
    warmed = engine_for(model)
    result = warm_up(warmed, LENGTHS, show=False, force=True)  # a thread per job, as on the GPU
    assert result.errors == [] and result.threads == 6
    assert set(result.job_seconds) == set(result.jobs) and all(t > 0 for t in result.job_seconds.values())
    hot = warmed.run(greedy_requests(prompts, NEW_TOKENS))
    assert [r.output for r in hot] == [r.output for r in cold]
    for a, b in zip(hot, cold):
        assert torch.equal(torch.stack(a.logits), torch.stack(b.logits))
    assert warmed.stats.first_token_at is not None


def test_it_is_skipped_where_it_compiles_nothing(model):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert "reference backend" in skip_reason("reference", cuda, LocalDsaAttention())
    assert "CPU" in skip_reason("nvidia", cpu, LocalDsaAttention())
    assert "multi-process attention (object" in skip_reason("nvidia", cuda, object())
    assert skip_reason("nvidia", cuda, LocalDsaAttention()) == ""
    engine = engine_for(model)
    with OpTimer() as timer:
        result = warm_up(engine, LENGTHS, show=False)  # the reference backend on the CPU: a no-op
    assert result.skipped.startswith("nothing to compile") and result.jobs == [] and timer.rows() == []


def _run_json(tmp_path, name, extra, capsys):
    path = tmp_path / f"{name}.json"
    assert main(SMALL + ["--json", str(path)] + extra) == 0
    captured = capsys.readouterr()
    return json.loads(path.read_text()), captured.out, captured.err


def test_dsahal_run_reports_the_warm_up_and_the_first_token(tmp_path, capsys, monkeypatch):
    report, out, err = _run_json(tmp_path, "default", [], capsys)
    assert "warm-up  skipped: nothing to compile: the reference backend runs eager torch" in out
    assert "compile " not in err  # nothing compiles on the reference: no phase line
    startup = report["startup"]
    assert startup["origin"] == "process start"
    assert 0 < startup["run_s"] < startup["header_s"] < startup["weights_s"] <= startup["warmup_s"] \
        < startup["first_token_s"]
    assert f"first token after {startup['first_token_s']:.2f} s from process start (start-up and imports " in out

    _, out, _ = _run_json(tmp_path, "off", ["--no-warmup"], capsys)
    assert "warm-up  skipped: --no-warmup" in out

    # The CLI path of the warm-up itself, forced on the reference (it would be skipped on the CPU):
    monkeypatch.setattr(warmup, "skip_reason", lambda *args: "")
    warmed, out, err = _run_json(tmp_path, "forced", [], capsys)
    assert "compile  warming up the kernels on dummy inputs: 6 jobs on 6 threads" in err
    assert "compile  6 warm-up jobs in " in err
    assert warmed["warmup"]["errors"] == [] and warmed["warmup"]["seconds"] > 0
    assert "warm-up  6 jobs on 6 threads in " in out and ", KDA decode " in out  # each job's own seconds
    assert warmed["outputs"] == report["outputs"]
    assert warmed["stats"]["prefill_steps"] == report["stats"]["prefill_steps"]
