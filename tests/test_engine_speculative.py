"""Speculative decoding (up to 7 drafts + 1 token per request per step) emits exactly plain greedy decoding."""
import pytest
import torch

from dsahal.engine import Request
from dsahal.model import SamplingParams
from test_model_helpers import greedy_requests, random_prompts, small_engine, small_model

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model():
    return small_model(seed=2)


@pytest.fixture(scope="module")
def plain(model):
    prompts = random_prompts([40, 23, 11], model.config.vocab_size, seed=11)
    return prompts, small_engine(model).run(greedy_requests(prompts, NEW_TOKENS))


def drafter_from(plain_runs, corrupt_every=0, count=7):
    """Drafts the true greedy continuation, with every ``corrupt_every``-th draft position replaced."""
    truth = {r.request_id: r.output for r in plain_runs}

    def drafter(request):
        future = truth[request.request_id][len(request.output):len(request.output) + count]
        if corrupt_every:
            future = [(t + 1) % 256 if (len(request.output) + i) % corrupt_every == corrupt_every - 1 else t
                      for i, t in enumerate(future)]
        return future
    return drafter


def run_speculative(model, prompts, drafter, max_drafts=7):
    engine = small_engine(model, drafter=drafter, max_draft_tokens=max_drafts)
    return engine, engine.run(greedy_requests(prompts, NEW_TOKENS))


def assert_same_as_plain(spec, plain_runs):
    for s, p in zip(spec, plain_runs):
        assert s.output == p.output
        torch.testing.assert_close(torch.stack(s.logits), torch.stack(p.logits), rtol=1e-3, atol=1e-3)


def test_correct_drafts_are_all_accepted_in_fewer_steps(model, plain):
    prompts, plain_runs = plain
    engine, spec = run_speculative(model, prompts, drafter_from(plain_runs))
    assert_same_as_plain(spec, plain_runs)
    assert engine.stats.accepted_draft_tokens == engine.stats.draft_tokens > 0
    assert engine.stats.decode_steps == 2  # 9 tokens after prefill: 1 + 7 drafts, then the last one


def test_rejected_drafts_rewind_the_kda_state_and_change_nothing(model, plain):
    prompts, plain_runs = plain
    engine, spec = run_speculative(model, prompts, drafter_from(plain_runs, corrupt_every=3), max_drafts=4)
    assert_same_as_plain(spec, plain_runs)
    assert 0 < engine.stats.accepted_draft_tokens < engine.stats.draft_tokens


def test_useless_drafts_still_give_the_greedy_tokens(model, plain):
    prompts, plain_runs = plain
    engine, spec = run_speculative(model, prompts, lambda request: [0] * 7)
    assert [s.output for s in spec] == [p.output for p in plain_runs]
    assert engine.stats.decode_steps == NEW_TOKENS - 1


def test_speculative_decoding_needs_greedy_requests_and_at_most_seven_drafts(model):
    with pytest.raises(ValueError, match="max_draft_tokens expected an int in \\[0, 7\\]"):
        small_engine(model, drafter=lambda r: [], max_draft_tokens=8)
    engine = small_engine(model, drafter=lambda r: [1])
    with pytest.raises(ValueError, match="verifies greedily"):
        engine.run([Request(0, [1, 2, 3], 4, SamplingParams(temperature=1.0, seed=0))])
