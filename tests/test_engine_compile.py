"""The decode step is one graph under ``torch.compile(fullgraph=True)`` and gives eager's logits."""
import pytest
import torch

from test_model_helpers import greedy_requests, random_prompts, small_engine, small_model


def run_decode(model, step=None):
    engine = small_engine(model)
    if step is not None:
        engine._decode_step = step
    return engine.run(greedy_requests(random_prompts([20, 9, 13], model.config.vocab_size, seed=8), 4))


def test_decode_step_compiles_as_one_graph_and_matches_eager():
    model = small_model()
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = run_decode(model, torch.compile(model.step, fullgraph=True, backend=recording_backend))
    eager = run_decode(model)
    assert graphs, "the decode step never went through the compiler"
    code = graphs[0].code
    assert "dsahal.kda_decode" in code and "dsahal.dsa_attention" in code  # the ops are in the graph, unbroken
    for c, e in zip(compiled, eager):
        assert c.output == e.output
        torch.testing.assert_close(torch.stack(c.logits), torch.stack(e.logits), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_decode_step_compiles_with_inductor_and_matches_eager():
    model = small_model()
    torch._dynamo.reset()
    compiled = run_decode(model, torch.compile(model.step, fullgraph=True))
    eager = run_decode(model)
    for c, e in zip(compiled, eager):
        assert c.output == e.output
        torch.testing.assert_close(torch.stack(c.logits), torch.stack(e.logits), rtol=1e-4, atol=1e-4)
