"""dsahal plan counts the weights each device holds (dense, routed and shared experts, under TP and EP), so
the cache budget left of a device's memory is right."""
import json

import pytest
import torch

from dsahal.model.weight_memory import weight_memory
from dsahal.cli import main
from dsahal.config import load_config
from dsahal.model import HybridModel


def deepseek_v32_parameters() -> int:
    """DeepSeek-V3.2-Exp's main model (no MTP layer) from its public config.json, computed here by hand."""
    hidden, vocab, layers, dense_layers = 7168, 129280, 61, 3
    heads, q_rank, kv_rank, nope, rope, v = 128, 1536, 512, 128, 64, 128
    index_heads, index_dim = 64, 128
    mla = (hidden * q_rank + q_rank + q_rank * heads * (nope + rope) + hidden * (kv_rank + rope) + kv_rank
           + kv_rank * heads * (nope + v) + heads * v * hidden)
    indexer = q_rank * index_heads * index_dim + hidden * index_dim + 2 * index_dim + hidden * index_heads
    dense_mlp = 3 * hidden * 18432
    moe = 256 * 3 * hidden * 2048 + 3 * hidden * 2048 + 256 * hidden + 256  # routed, shared, router + bias
    per_layer = mla + indexer + 2 * hidden
    return (2 * vocab * hidden + hidden + layers * per_layer + dense_layers * dense_mlp
            + (layers - dense_layers) * moe)


def test_deepseek_v32_estimate_matches_the_public_model_size():
    estimate = weight_memory(load_config("deepseek-v3.2"))
    expected = deepseek_v32_parameters()
    assert abs(estimate.parameters - expected) / expected < 0.01
    assert abs(estimate.parameters - 671e9) / 671e9 < 0.03  # DeepSeek-V3's published 671 B total parameters
    # The routed experts are nearly all of it; a planner that left them out would be off by ~97 %.
    assert estimate.parameters_by_part["routed_experts"] == 58 * 256 * 3 * 7168 * 2048
    assert estimate.parameters_by_part["shared_experts"] == 58 * 3 * 7168 * 2048
    assert estimate.device_bytes == 2 * estimate.parameters  # bf16, one device holds it all


@pytest.mark.parametrize("name", ["tiny", "deepseek-v3.2-tiny", "k31-pro-slice"])
def test_count_equals_the_model_built_on_the_meta_device(name):
    config = load_config(name)
    with torch.device("meta"):
        model = HybridModel(config)
    assert weight_memory(config).parameters == sum(p.numel() for p in model.parameters())


def test_tp_and_ep_split_what_each_device_holds():
    config = load_config("deepseek-v3.2")
    whole = weight_memory(config).device_bytes_by_part
    split = weight_memory(config, tp=8, ep=8)
    parts = split.device_bytes_by_part
    assert split.routed_experts_per_device == 32
    assert parts["routed_experts"] * 8 == whole["routed_experts"]
    assert parts["shared_experts"] * 8 == whole["shared_experts"] and parts["dense_mlp"] * 8 == whole["dense_mlp"]
    assert parts["router"] == whole["router"] and parts["norms"] == whole["norms"]  # replicated
    # MLA: q_up, kv_up, o_proj split; q_down, kv_down and the indexer replicated on every device.
    replicated = (7168 * 1536 + 1536 + 7168 * 576 + 512
                  + 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64)
    heads = 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168
    assert parts["attention"] == 2 * 61 * (replicated + heads // 8)
    assert weight_memory(config, tp=8, ep=1).device_bytes_by_part["routed_experts"] == whole["routed_experts"]


def test_fp8_counts_one_byte_and_a_block_scale_per_128x128():
    config = load_config("deepseek-v3.2")
    bf16 = weight_memory(config, ep=256).device_bytes_by_part["routed_experts"]
    fp8 = weight_memory(config, ep=256, weights_dtype="fp8").device_bytes_by_part["routed_experts"]
    per_expert = 3 * (2048 * 7168 + 4 * (2048 // 128) * (7168 // 128))  # gate, up, down: one expert per device
    assert fp8 == 58 * per_expert and bf16 == 58 * 3 * 2 * 2048 * 7168


def test_device_gib_leaves_the_cache_what_the_weights_do_not_take(capsys):
    assert main(["plan", "--config", "deepseek-v3.2", "--tp", "8", "--ep", "8", "--weights-dtype", "fp8",
                 "--device-gib", "141", "--context", "128k", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    weights = weight_memory(load_config("deepseek-v3.2"), tp=8, ep=8, weights_dtype="fp8").device_bytes
    assert plan["capacity"]["budget_bytes"] == 141 * 2**30 - weights
    assert plan["weights"]["device_bytes"] == weights and plan["weights"]["routed_experts_per_device"] == 32
    assert main(["plan", "--config", "deepseek-v3.2", "--tp", "8", "--ep", "8", "--weights-dtype", "fp8",
                 "--device-gib", "141", "--context", "128k"]) == 0
    text = capsys.readouterr().out
    assert "weights per device: " in text and "(32 of 256 per MoE layer)" in text and "cache budget = 141" in text


@pytest.mark.parametrize("extra, message", [
    (["--config", "deepseek-v3.2", "--device-gib", "141"], "argument '--device-gib' expected more than the"),
    (["--config", "deepseek-v3.2", "--memory-gib", "1", "--device-gib", "141"], "got both"),
    (["--config", "deepseek-v3.2"], "got neither"),
    (["--config", "deepseek-v3.2", "--memory-gib", "1", "--ep", "3"], "argument '--ep' expected a divisor"),
    (["--config", "k31-pro", "--memory-gib", "1", "--ep", "2"], "has no MoE layers"),
])
def test_weight_arguments_errors_are_one_line(capsys, extra, message):
    assert main(["plan", "--context", "128k", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: dsahal plan: ") and message in err[0], err
