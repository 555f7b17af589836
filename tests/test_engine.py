"""The engine loop: chunked prefill + decode against recomputation, batch independence, freeing, sampling."""
import pytest
import torch

from dsahal.engine import Request
from dsahal.model import SamplingParams
from test_model_helpers import full_sequence_logits, greedy_requests, random_prompts, small_engine, small_model

PROMPT_LENGTHS = [70, 45, 9]  # longer and shorter than top-k (32), several blocks of 16, chunk 48
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model():
    return small_model()


@pytest.fixture(scope="module")
def batch_run(model):
    engine = small_engine(model)
    prompts = random_prompts(PROMPT_LENGTHS, model.config.vocab_size)
    return engine, engine.run(greedy_requests(prompts, NEW_TOKENS))


def test_every_request_gets_its_tokens_and_the_steps_were_chunked(batch_run):
    engine, finished = batch_run
    assert [len(r.output) for r in finished] == [NEW_TOKENS] * 3
    assert engine.stats.prefill_steps == 3  # 124 prompt tokens in chunks of 48
    assert engine.stats.prefill_tokens == sum(PROMPT_LENGTHS)
    assert engine.stats.decode_tokens == 3 * (NEW_TOKENS - 1)


def test_prefill_plus_decode_equals_recomputing_the_whole_sequence(model, batch_run):
    _, finished = batch_run
    for request in finished:
        sequence = request.prompt + request.output[:-1]
        recomputed = full_sequence_logits(model, sequence)[len(request.prompt) - 1:]
        torch.testing.assert_close(torch.stack(request.logits), recomputed, rtol=1e-3, atol=1e-3)


def test_a_requests_logits_do_not_depend_on_the_rest_of_its_batch(model, batch_run):
    _, finished = batch_run
    prompts = [r.prompt for r in finished]
    alone = small_engine(model).run(greedy_requests(prompts[1:2], NEW_TOKENS))[0]
    assert alone.output == finished[1].output
    torch.testing.assert_close(torch.stack(alone.logits), torch.stack(finished[1].logits), rtol=1e-4, atol=1e-4)


def test_finished_requests_give_their_rows_blocks_and_states_back(model):
    engine = small_engine(model, max_batch=2)
    prompts = random_prompts([20, 33, 5, 17, 40], model.config.vocab_size, seed=4)
    free_rows = list(engine.free_rows)
    finished = engine.run([Request(i, p, 2 + i) for i, p in enumerate(prompts)])  # 5 requests through 2 rows
    assert [len(r.output) for r in finished] == [2, 3, 4, 5, 6]
    assert sorted(engine.free_rows) == free_rows
    assert bool((engine.block_table == -1).all())
    assert all(r.row is None and r.blocks == [] and r.state_id is None for r in finished)
    again = small_engine(model, max_batch=2)  # the same cache capacity serves them one more time
    assert [r.output for r in again.run([Request(i, p, 2 + i) for i, p in enumerate(prompts)])] == \
        [r.output for r in finished]


def test_a_reused_kda_state_starts_from_zero(model):
    prompts = random_prompts([25, 25], model.config.vocab_size, seed=5)
    engine = small_engine(model, max_batch=1)
    first, second = engine.run([Request(0, prompts[0], 3), Request(1, prompts[1], 3, record_logits=True)])
    fresh = small_engine(model, max_batch=1).run([Request(1, prompts[1], 3, record_logits=True)])[0]
    assert second.output == fresh.output
    torch.testing.assert_close(torch.stack(second.logits), torch.stack(fresh.logits), rtol=1e-5, atol=1e-5)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(model):
    prompts = random_prompts([12, 30, 22], model.config.vocab_size, seed=6)
    def sampled(indices, seed):
        requests = [Request(i, prompts[i], 8, SamplingParams(temperature=1.0, seed=seed + i)) for i in indices]
        return {r.request_id: r.output for r in small_engine(model).run(requests)}
    together = sampled([0, 1, 2], seed=10)
    assert sampled([1], seed=10)[1] == together[1]
    assert sampled([0, 1, 2], seed=10) == together
    assert sampled([0, 1, 2], seed=99) != together


def test_forced_tokens_replace_sampling(model):
    prompt = random_prompts([10], model.config.vocab_size, seed=7)[0]
    forced = [3, 1, 4, 1]
    assert small_engine(model).run([Request(0, prompt, 4, forced_tokens=forced)])[0].output == forced


def test_requests_that_cannot_fit_are_refused_with_the_reason(model):
    engine = small_engine(model, max_context=64)
    with pytest.raises(ValueError, match="needs 70 tokens"):
        engine.add(Request(0, [1] * 60, 11))
    with pytest.raises(ValueError, match="token ids outside"):
        engine.add(Request(1, [1, model.config.vocab_size], 2))
    engine.add(Request(2, [1], 2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add(Request(2, [1], 2))
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request(3, [1], 0)
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(temperature=0.5)


def test_requests_wait_for_cache_rows_and_one_that_can_never_fit_is_an_error(model):
    from dsahal.engine import Engine, build_cache

    cache = build_cache(model.config, max_batch=1, max_context=64, block_tokens=16)  # room for one request
    engine = Engine(model, cache, latent_fmt="bf16", index_fmt="fp8", max_batch=2, max_context=64)
    prompts = random_prompts([40, 30], model.config.vocab_size, seed=9)
    finished = engine.run([Request(0, prompts[0], 3), Request(1, prompts[1], 3)])
    assert [len(r.output) for r in finished] == [3, 3]
    assert engine.stats.decode_steps == 4  # never both at once: 2 + 2 decode steps
    small = Engine(model, build_cache(model.config, max_batch=1, max_context=16, block_tokens=16),
                   latent_fmt="bf16", index_fmt="fp8", max_batch=1, max_context=64)
    with pytest.raises(RuntimeError, match="needs 3 cache blocks"):
        small.run([Request(0, prompts[0], 3)])


@pytest.mark.parametrize("validate,after", [("first", False), ("always", True), ("never", False)])
def test_op_argument_checks_stop_after_a_validated_prefill_and_decode_step(validate, after):
    from dsahal.model import LocalDsaAttention
    from test_model_helpers import small_model

    model = small_model(seed=3)
    model.set_attention(LocalDsaAttention(check=True))
    engine = small_engine(model, validate=validate)
    seen = []

    def progress(eng, batch):
        seen.append((batch.meta.decode, model.check_ops, model.attention.check))

    engine.run(greedy_requests(random_prompts([20, 9], model.config.vocab_size), 3), progress=progress)
    first_prefill = next(s for s in seen if not s[0])
    assert first_prefill[1:] == ((validate != "never"),) * 2  # the first step ran with checks as asked
    assert (model.check_ops, model.attention.check) == (after, after)
    if validate == "first":  # on until the first decode step has passed
        first_decode = seen.index(next(s for s in seen if s[0]))
        assert all(s[1] for s in seen[:first_decode])


def test_engine_rejects_an_unknown_validate_mode(model):
    with pytest.raises(ValueError, match="validate expected one of"):
        small_engine(model, validate="sometimes")
