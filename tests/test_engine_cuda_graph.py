"""CUDA-graph decode steps, the parts that need no GPU: sizes, padding, static buffers, and the proof that
padding rows are harmless (the padded eager step over the static buffers, which is exactly what gets
captured, gives the unpadded step's logits and writes nothing else into the cache or KDA states).

The capture and replay themselves run only on a GPU (``dsahal run --cuda-graph``, ``dsahal bench``).
"""
import pytest
import torch

from dsahal.cli import build_parser, main
from dsahal.engine import Engine, Request
from dsahal.engine.cuda_graph import (DecodeBuffers, DecodeGraphs, DecodeInputs, graph_batch_sizes,
                                      pad_decode_inputs)
from test_model_helpers import greedy_requests, random_prompts, small_engine, small_model


@pytest.fixture(scope="module")
def model():
    return small_model()


def test_graph_sizes_are_powers_of_two_then_multiples_of_8_and_max_batch():
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(30) == [1, 2, 4, 8, 16, 24, 30]
    assert graph_batch_sizes(64)[-3:] == [48, 56, 64]
    with pytest.raises(ValueError, match="max_batch expected an int >= 1"):
        graph_batch_sizes(0)


def _inputs(batch=3):
    return DecodeInputs(
        token_ids=torch.tensor([5, 6, 7][:batch]), positions=torch.tensor([10, 3, 40][:batch], dtype=torch.int32),
        req_ids=torch.tensor([2, 0, 1][:batch], dtype=torch.int32), slots=torch.tensor([170, 35, 88][:batch]),
        cu_seqlens=torch.arange(batch + 1, dtype=torch.int32), state_ids=torch.tensor([4, 0, 2][:batch],
                                                                                      dtype=torch.int32),
        batch=batch)


def test_padding_rows_write_no_slot_no_state_and_read_the_unmapped_row():
    padded = pad_decode_inputs(_inputs(), 8, padding_row=4)
    assert padded.size == 8 and padded.batch == 3
    assert padded.token_ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert padded.positions.tolist() == [10, 3, 40, 0, 0, 0, 0, 0]
    assert padded.req_ids.tolist() == [2, 0, 1, 4, 4, 4, 4, 4]
    assert padded.slots.tolist() == [170, 35, 88, -1, -1, -1, -1, -1]
    assert padded.state_ids.tolist() == [4, 0, 2, -1, -1, -1, -1, -1]
    assert padded.cu_seqlens.tolist() == list(range(9))
    assert [t.dtype for t in (padded.token_ids, padded.positions, padded.req_ids, padded.slots, padded.cu_seqlens,
                              padded.state_ids)] == [torch.int64, torch.int32, torch.int32, torch.int64, torch.int32,
                                                     torch.int32]
    assert pad_decode_inputs(_inputs(), 3, padding_row=4).slots.tolist() == [170, 35, 88]  # no padding needed
    with pytest.raises(ValueError, match="size 2 is smaller than the batch"):
        pad_decode_inputs(_inputs(), 2, padding_row=4)


def test_buffers_are_allocated_once_and_sliced_per_size():
    buffers = DecodeBuffers(max_size=8, max_batch=5, max_blocks=3, device="cpu")
    pointers = {name: t.data_ptr() for name, t in buffers.tensors.items()}
    table_pointer = buffers.block_table.data_ptr()
    assert buffers.block_table.shape == (6, 3) and buffers.padding_row == 5
    view = buffers.view(4)
    assert view.token_ids.data_ptr() == pointers["token_ids"] and view.size == 4 and view.cu_seqlens.shape == (5,)
    assert buffers.view(8).state_ids.tolist() == [-1] * 8  # padding from the start
    buffers.load(pad_decode_inputs(_inputs(), 4, buffers.padding_row))
    assert buffers.view(4).slots.tolist() == [170, 35, 88, -1] and buffers.view(4).req_ids.tolist() == [2, 0, 1, 5]
    host_table = torch.arange(15, dtype=torch.int32).view(5, 3)
    buffers.load_block_table(host_table, version=1)
    assert torch.equal(buffers.block_table[:5], host_table) and buffers.block_table[5].tolist() == [-1, -1, -1]
    host_table[0, 0] = 99
    buffers.load_block_table(host_table, version=1)  # same version: not copied again
    assert int(buffers.block_table[0, 0]) == 0
    buffers.load_block_table(host_table, version=2)
    assert int(buffers.block_table[0, 0]) == 99
    with pytest.raises(ValueError, match=r"block_table expected shape \[5, 3\]"):
        buffers.load_block_table(torch.zeros(4, 3, dtype=torch.int32))
    buffers.fill_padding(8)
    assert buffers.view(8).slots.tolist() == [-1] * 8 and buffers.view(8).req_ids.tolist() == [5] * 8
    assert {name: t.data_ptr() for name, t in buffers.tensors.items()} == pointers
    assert buffers.block_table.data_ptr() == table_pointer


def test_size_for_picks_the_smallest_bucket_that_holds_the_batch(model):
    engine = small_engine(model, max_batch=12)
    graphs = DecodeGraphs(model, engine.views, max_batch=12, max_blocks=engine.max_blocks,
                          max_context=engine.max_context, device="cpu")
    assert graphs.sizes == [1, 2, 4, 8, 12]
    assert [graphs.size_for(b) for b in (1, 2, 3, 5, 8, 9, 12)] == [1, 2, 4, 8, 8, 12, 12]
    with pytest.raises(ValueError, match="exceeds the largest graph size 12"):
        graphs.size_for(13)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        graphs.capture(4)


def test_the_captured_step_runs_the_models_fused_glue_and_eager_steps_do_not(model, monkeypatch):
    """DecodeGraphs.forward (what is captured) switches dsahal.model.fused on; outside it, and so in eager
    steps, it is off unless enabled by default (its first use compiles kernels: BENCHMARKS.md, seventh session)."""
    from dsahal.model import fused

    engine = small_engine(model, max_batch=4)
    graphs = DecodeGraphs(model, engine.views, max_batch=4, max_blocks=engine.max_blocks,
                          max_context=engine.max_context, device="cpu")
    seen = []
    monkeypatch.setattr(model, "step", lambda *args, **kwargs: seen.append(fused._enabled) or torch.zeros(1))
    graphs.forward(4)
    assert seen == [1], f"the captured step ran with fused._enabled={seen}"
    assert fused._enabled == 0 and not fused.on_by_default()


def _engine_at_first_decode(model, prompts):
    """An engine whose requests are all prefilled: its next step is a decode step of len(prompts) requests."""
    engine = small_engine(model, max_batch=6)
    for request in greedy_requests(prompts, 4):
        engine.add(request)
    while any(r.in_prefill for r in engine.running) or engine.waiting:
        engine.step()
    return engine


@torch.no_grad()
def test_the_padded_step_over_the_static_buffers_equals_the_unpadded_step_and_writes_nothing_more(model):
    from dsahal.engine.batch import build_step

    prompts = random_prompts([37, 12, 21], model.config.vocab_size, seed=3)
    engine = _engine_at_first_decode(model, prompts)
    scheduled, decode = engine._schedule()
    assert decode and len(scheduled) == 3
    batch = build_step(scheduled, engine.block_table, engine.block_tokens, engine.max_context, True, engine.device)
    before = engine.cache.pool.clone()

    unpadded = engine._forward(batch)  # the eager decode step
    after_unpadded = engine.cache.pool.clone()
    engine.cache.pool.copy_(before)

    graphs = DecodeGraphs(model, engine.views, max_batch=6, max_blocks=engine.max_blocks,
                          max_context=engine.max_context, device="cpu", sizes=[6])
    size = graphs.load(DecodeInputs.from_step(batch), engine.block_table, engine._table_version)
    assert size == 6
    padded = graphs.forward(size)  # what the graph of 6 rows runs: 3 requests + 3 padding rows
    after_padded = engine.cache.pool.clone()

    assert padded.shape == (6, model.config.vocab_size)
    # float32 on the CPU: GEMMs of 6 and of 3 rows may block differently (a few ulps of the logits)
    torch.testing.assert_close(padded[:3], unpadded, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(padded).all()  # padding rows read nothing, yet give finite rows (ignored)
    # The pool rows (DSA blocks, KDA state rows) the padded step changed are exactly those the unpadded
    # step changed: padding rows write nothing. (Bytes within them may differ in the last bits: a matmul
    # over 6 rows need not round like one over 3.)
    def changed_rows(after):
        return set((after != before).any(dim=1).nonzero().flatten().tolist())

    owned = set()
    per_state = engine.cache.layout.rows_per_state
    for request in engine.running:
        owned |= set(request.blocks) | set(range(request.state_id * per_state, (request.state_id + 1) * per_state))
    assert changed_rows(after_padded) == changed_rows(after_unpadded) and changed_rows(after_padded) <= owned
    for layer in model.config.kda_layers:
        torch.testing.assert_close(_pool_view(engine, after_padded, layer), _pool_view(engine, after_unpadded, layer),
                                   rtol=1e-5, atol=1e-6)
    latent = engine.views.layer(model.config.dsa_layers[0]).latent_pages  # bf16 records: compare values
    blocks, within = batch.meta.slots // engine.block_tokens, batch.meta.slots % engine.block_tokens
    engine.cache.pool.copy_(after_padded)
    got = latent[blocks, within].clone()
    engine.cache.pool.copy_(after_unpadded)
    want = latent[blocks, within].clone()
    torch.testing.assert_close(got.view(torch.bfloat16), want.view(torch.bfloat16), rtol=1e-2, atol=1e-2)


def _pool_view(engine, pool_bytes, layer):
    engine.cache.pool.copy_(pool_bytes)
    return engine.views.layer(layer).clone()


class EagerReplayGraphs(DecodeGraphs):
    """A test double for the engine's bookkeeping around its graphs on the CPU: "capture" records the
    size and "replay" runs the captured function (the eager step over the static buffers). It checks
    the engine's use of the buffers (padding, block-table refresh, sizes as the batch shrinks), not
    CUDA graphs."""

    def capture(self, size):
        self.graphs[size] = None
        return 0.25

    def replay(self, size):
        return self.forward(size)


def test_the_engine_through_static_buffers_emits_the_eager_tokens_as_requests_come_and_go(model):
    prompts = random_prompts([30, 9, 22, 14, 40], model.config.vocab_size, seed=11)
    new_tokens = [5, 2, 7, 3, 4]  # requests finish at different steps: the batch shrinks, rows are reused

    def requests():
        return [Request(i, p, new_tokens[i], record_logits=True) for i, p in enumerate(prompts)]

    eager = small_engine(model, max_batch=3).run(requests())
    engine = small_engine(model, max_batch=3)
    engine.graphs = EagerReplayGraphs(model, engine.views, max_batch=3, max_blocks=engine.max_blocks,
                                      max_context=engine.max_context, device="cpu")
    replayed = engine.run(requests())
    assert [r.output for r in replayed] == [r.output for r in eager]
    for a, b in zip(replayed, eager):
        torch.testing.assert_close(torch.stack(a.logits), torch.stack(b.logits), rtol=1e-5, atol=1e-5)
    stats = engine.stats
    assert stats.graph_steps == stats.decode_steps > 0
    assert stats.graph_capture_seconds == 0.25 * len(stats.graph_sizes)
    assert set(stats.graph_sizes) <= {1, 2, 3} and len(stats.graph_sizes) == len(set(stats.graph_sizes))
    assert stats.decode_tokens == sum(new_tokens) - len(new_tokens)


def test_cuda_graph_on_a_cpu_model_is_a_clear_error(model):
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device, the model is on cpu"):
        small_engine(model, cuda_graph=True)


def test_cuda_graph_with_compile_a_drafter_dcp_or_the_reference_is_refused():
    # On a CPU machine the device check comes first; the others are checked on an engine "on CUDA".
    engine = Engine.__new__(Engine)
    engine.device, engine.drafter, engine.context_shards = torch.device("cuda"), None, 1
    with pytest.raises(ValueError, match="cannot be combined with compile_decode"):
        engine._check_cuda_graph(compile_decode=True)
    engine.drafter = lambda request: []
    with pytest.raises(ValueError, match="cannot be combined with a drafter"):
        engine._check_cuda_graph(compile_decode=False)
    engine.drafter, engine.context_shards = None, 2
    with pytest.raises(ValueError, match="cannot be combined with decode context parallelism"):
        engine._check_cuda_graph(compile_decode=False)
    engine.context_shards = 1
    with pytest.raises(ValueError, match="on the reference backend"):  # the CPU machine's backend
        engine._check_cuda_graph(compile_decode=False)


def test_run_parses_cuda_graph_and_refuses_it_on_the_cpu(capsys):
    args = build_parser().parse_args(["run", "--cuda-graph"])
    assert args.cuda_graph is True
    assert build_parser().parse_args(["run"]).cuda_graph is False
    assert main(["run", "--cuda-graph", "--batch", "1", "--prompt-len", "4", "--decode", "2"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    # one line, said before the model is built (nothing on stdout: no header, no weights drawn)
    assert err == [err[0]] and err[0].startswith("error: dsahal run: argument '--cuda-graph' needs a CUDA device")
    assert captured.out == ""


def test_the_run_report_says_whether_decode_steps_were_replayed_from_graphs(tmp_path, capsys):
    import io
    import json

    from dsahal.engine.report import print_report

    path = tmp_path / "run.json"
    assert main(["run", "--batch", "2", "--prompt-len", "12", "--decode", "3", "--block-tokens", "16",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["cuda_graph"] is False and "(2 steps, eager)" in out
    assert report["stats"]["graph_steps"] == 0 and report["stats"]["graph_capture_seconds"] == 0.0
    # What a --cuda-graph run's report holds (stats as the engine fills them), printed:
    report["cuda_graph"] = True
    report["stats"].update(graph_steps=2, graph_sizes=[2], graph_capture_seconds=1.5)
    text = io.StringIO()
    print_report(report, text)
    assert "(2 steps, 2 replayed from CUDA graphs)" in text.getvalue()
    assert "capturing 1 CUDA graph(s) for batch size(s) [2], 1.50 s with warm-up, is not counted" in text.getvalue()
    assert "their ops are not below" in text.getvalue()
