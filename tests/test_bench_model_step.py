"""`dsahal bench`: the "model decode step" case and the row-by-row output, the parts that run on the CPU
(the timing itself needs a GPU)."""
import io

import pytest
import torch

import dsahal.registry
from dsahal.bench import report
from dsahal.bench.cases import Case, all_cases, model_decode_case
from dsahal.bench.model_step import (CHECK_CONTEXTS, check_model_decode, decode_setup, init_weights_on_device,
                                     step_cost)
from dsahal.bench.timing import Ceilings
from dsahal.cli.bench import RowPrinter
from dsahal.config import load_config
from dsahal.model import HybridModel, init_weights


def test_the_case_list_has_the_model_decode_step_at_full_and_quick_shapes():
    full = [c for c in all_cases() if c.op == "model"]
    quick = [c for c in all_cases(quick=True) if c.op == "model"]
    assert [c.name for c in full] == ["model decode step"] and full[0].build is not None
    assert full[0].shape == "k31-pro-slice, 64 req x ctx 4096"
    assert quick[0].shape == "k31-pro-slice, 16 req x ctx 1024"
    assert model_decode_case(True).shape == quick[0].shape


def test_the_correctness_check_passes_on_the_reference_and_catches_a_skewed_backend(monkeypatch):
    ok, detail = check_model_decode(torch.device("cpu"), "reference")
    assert ok and "rel err vs reference 0.0e+00" in detail and "not on CUDA" in detail
    assert "5 rows padded to 8" in detail and "padding rows wrote nothing: True" in detail
    monkeypatch.setenv("DSAHAL_PLUGIN_MODULES", "test_run_cli")  # sparse MLA outputs scaled by 1.05
    dsahal.registry.reset()
    ok, detail = check_model_decode(torch.device("cpu"), "skewed")
    assert not ok, detail


def test_the_decode_setup_decodes_each_request_at_its_context_into_its_own_blocks():
    setup = decode_setup(load_config("tiny"), CHECK_CONTEXTS, "cpu", dtype=torch.float32)
    inputs, table = setup.inputs, setup.block_table
    assert inputs.positions.tolist() == CHECK_CONTEXTS and inputs.req_ids.tolist() == list(range(5))
    blocks = inputs.slots // 64
    assert [int(table[r, p // 64]) for r, p in enumerate(CHECK_CONTEXTS)] == blocks.tolist()
    assert len(set(inputs.state_ids.tolist())) == 5 and int(inputs.state_ids.min()) >= 0
    assert setup.max_context == table.shape[1] * 64 >= max(CHECK_CONTEXTS) + 1
    before = setup.cache.pool.clone()
    logits = setup.step()
    assert logits.shape == (5, 512) and bool(torch.isfinite(logits).all())
    assert not torch.equal(before, setup.cache.pool)  # the step wrote its tokens and advanced the states
    nbytes, flops = step_cost(setup, CHECK_CONTEXTS)
    weights = sum(p.numel() * 4 for p in setup.model.parameters()) - setup.model.embed.weight.numel() * 4
    assert nbytes > weights and flops > 2 * 5 * weights / 4


def test_device_drawn_weights_follow_init_weights(monkeypatch):
    config = load_config("tiny")
    reference = init_weights(HybridModel(config), seed=3)
    same = init_weights_on_device(HybridModel(config), seed=3)  # every tiny tensor is small: the same rule
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), same.parameters()))
    monkeypatch.setattr("dsahal.bench.model_step.SMALL_PARAM", 0)  # every matrix drawn "on the device"
    drawn = dict(init_weights_on_device(HybridModel(config), seed=3).named_parameters())
    for name, param in reference.named_parameters():
        if param.dim() == 2 and param.numel() > 4096:
            assert drawn[name].std().item() == pytest.approx(param.std().item(), rel=0.1), name


def _row(name, check="pass", ms=1.0):
    return report.Row(name, "op", "shape", check, "detail of " + name, ms=ms)


def test_rows_print_as_they_finish_with_the_header_once():
    out = io.StringIO()
    printer = RowPrinter(out)
    ceilings = Ceilings(copy_tbps=4.0, matmul_tflops=700.0)
    printer(ceilings, _row("a"))
    first = out.getvalue()
    assert first.count("| op | shape |") == 1 and first.rstrip().endswith("| - |")
    printer(ceilings, _row("b", check="error", ms=None))
    lines = out.getvalue().splitlines()
    assert sum("| op | shape |" in line for line in lines) == 1
    assert lines[-1].startswith("| b | shape | error: detail of b |")


def test_a_case_that_raises_gets_an_error_row_and_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(report, "measure_ceilings", lambda device: Ceilings(4.0, 700.0))

    def run_case(case, backend, device, ceilings, graphs):
        if case.name == "broken":
            raise RuntimeError("kernel exploded")
        return _row(case.name)

    monkeypatch.setattr(report, "run_case", run_case)
    seen = []
    cases = [Case(n, "op", "shape", None, None) for n in ("first", "broken", "last")]
    _, rows = report.run_bench(cases, "reference", on_row=lambda ceilings, row: seen.append(row.name))
    assert seen == ["first", "broken", "last"]
    assert [r.check for r in rows] == ["pass", "error", "pass"]
    assert rows[1].check_detail == "RuntimeError: kernel exploded"
    text = report.table(Ceilings(4.0, 700.0), rows)
    assert "FAILED broken shape: RuntimeError: kernel exploded" in text


def test_the_check_catches_padding_rows_that_write(monkeypatch):
    from dsahal.engine import cuda_graph

    real = cuda_graph.pad_decode_inputs

    def writing_padding(inputs, size, padding_row):  # padding rows write into a free row (the highest one)
        padded = real(inputs, size, padding_row)
        padded.slots[inputs.batch:] = 64 * 64 + torch.arange(size - inputs.batch)
        return padded

    monkeypatch.setattr(cuda_graph, "pad_decode_inputs", writing_padding)
    ok, detail = check_model_decode(torch.device("cpu"), "reference")
    assert not ok and "padding rows wrote nothing: False" in detail


def test_bench_runs_the_asked_ops_in_the_order_asked():
    from dsahal.bench.cases import all_cases
    from dsahal.cli.bench import select_cases

    cases = all_cases(quick=True)
    chosen = select_cases(cases, ["dsa_attention", "model", "topk"])
    assert [c.op for c in chosen] == ["dsa_attention", "dsa_attention", "model", "topk", "topk"]  # Gaussian, indexer scores
    assert select_cases(cases, None) == cases
