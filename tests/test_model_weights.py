"""Seeded initialisation, safetensors save/load, and the errors for checkpoints that do not fit."""
import dataclasses

import pytest
import torch
from safetensors.torch import save_file

from dsahal.model import CheckpointError, HybridModel, checkpoint_config, init_weights, load_weights, save_weights
from test_model_helpers import full_sequence_logits, random_prompts, small_config, small_model


def test_a_seed_gives_the_same_weights_and_another_seed_different_ones():
    a, b, c = small_model(seed=3), small_model(seed=3), small_model(seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.blocks[0].attn.q_proj.weight, c.blocks[0].attn.q_proj.weight)


def test_save_then_load_gives_identical_logits(tmp_path):
    model = small_model(seed=1)
    path = tmp_path / "tiny.safetensors"
    save_weights(model, path)
    loaded = load_weights(init_weights(HybridModel(model.config), seed=2), path)
    tokens = random_prompts([30], model.config.vocab_size)[0]
    assert torch.equal(full_sequence_logits(loaded, tokens), full_sequence_logits(model, tokens))
    assert checkpoint_config(path) == model.config


def test_checkpoints_hold_no_pickle(tmp_path):
    path = tmp_path / "w.safetensors"
    save_weights(small_model(), path)
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert path.read_bytes()[8:9] == b"{" and header_len < path.stat().st_size  # a JSON header, raw tensor bytes


def test_a_checkpoint_of_another_shape_names_the_tensor_and_both_shapes(tmp_path):
    path = tmp_path / "wide.safetensors"
    save_weights(small_model(small_config(hidden_size=192)), path)
    with pytest.raises(CheckpointError) as info:
        load_weights(small_model(), path)
    message = str(info.value)
    assert "tensor 'embed.weight': checkpoint shape [256, 192], model expects [256, 128]" in message
    assert "wide.safetensors" in message
    assert "hidden_size: checkpoint 192, model 128" in message


def test_a_checkpoint_with_missing_and_unexpected_tensors_names_them(tmp_path):
    model = small_model()
    tensors = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    tensors["extra.bias"] = torch.zeros(3)
    path = tmp_path / "partial.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"missing tensor 'lm_head.weight'") as info:
        load_weights(model, path)
    assert "unexpected tensor 'extra.bias' (checkpoint shape [3])" in str(info.value)


def test_a_file_that_is_not_safetensors_is_refused_by_name(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"x": torch.zeros(1)}, path)  # a pickle: never unpickled
    with pytest.raises(CheckpointError, match="cannot read .*model.pt.* as safetensors"):
        load_weights(small_model(), path)


def test_a_failed_load_changes_no_weight(tmp_path):
    model = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "wide.safetensors"
    save_weights(small_model(small_config(hidden_size=192)), path)
    with pytest.raises(CheckpointError):
        load_weights(model, path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@torch.no_grad()
def test_initialisation_keeps_activations_order_one_through_many_layers():
    config = dataclasses.replace(small_config(), layer_kinds=("kda", "kda", "kda", "dsa") * 6)  # 24 layers
    model = small_model(config)
    captured = []
    for block in model.blocks:
        block.register_forward_hook(lambda mod, inp, out: captured.append(out.pow(2).mean().sqrt().item()))
    logits = full_sequence_logits(model, random_prompts([40], config.vocab_size)[0])
    assert all(0.5 < rms < 3.0 for rms in captured), captured
    assert 0.3 < logits.std().item() < 3.0
