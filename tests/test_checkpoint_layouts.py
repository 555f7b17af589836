"""Public checkpoint layouts on synthetic checkpoints written in exactly those layouts: DeepSeek-V3.2 names
in 2 shards with model.safetensors.index.json, FP8 e4m3 weights with 128x128 `_scale_inv` blocks, and the
K3-style hybrid (fla KDA names + DeepSeek MLA names). The writer below spells every name out itself."""
import dataclasses
import json

import pytest
import torch
from safetensors.torch import save_file

from dsahal.cli import main
from dsahal.config import load_config
from dsahal.model import CheckpointError, HybridModel, init_weights
from dsahal.model.checkpoint import dequantize_fp8, load_checkpoint, public_name, save_checkpoint
from test_model_helpers import full_sequence_logits, random_prompts, small_config

MLA = {"q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj", "kv_down": "kv_a_proj_with_mqa",
       "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "o_proj": "o_proj", "index_q_up": "indexer.wq_b",
       "index_k_proj": "indexer.wk", "index_k_norm": "indexer.k_norm", "index_weights_proj": "indexer.weights_proj"}
KDA = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "decay_down": "f_proj.0",
       "decay_up": "f_proj.1", "gate_down": "g_proj.0", "gate_up": "g_proj.1", "beta_proj": "b_proj",
       "A_log": "A_log", "dt_bias": "dt_bias", "o_norm": "o_norm", "o_proj": "o_proj"}
FP8_TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "wq_b", "wk", "gate_proj",
               "up_proj", "down_proj", "q_proj", "k_proj", "v_proj")


def hand_written_tensors(model):
    """Every tensor under the public name the brief lists, taken from ``model``'s modules directly."""
    c, out = model.config, {}
    out["model.embed_tokens.weight"] = model.embed.weight
    out["model.norm.weight"] = model.final_norm.weight
    out["lm_head.weight"] = model.lm_head.weight
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = block.attn_norm.weight
        out[p + "post_attention_layernorm.weight"] = block.mlp_norm.weight
        table = MLA if c.layer_kinds[i] == "dsa" else KDA
        for conv in ("q_conv1d", "k_conv1d", "v_conv1d"):  # fla's short convolutions, [D, 1, K] as fla stores them
            if c.layer_kinds[i] == "kda" and hasattr(block.attn, conv):
                weight = getattr(block.attn, conv).weight
                out[p + f"self_attn.{conv}.weight"] = weight.reshape(weight.shape[0], 1, weight.shape[-1])
        for ours, theirs in table.items():
            module = getattr(block.attn, ours)
            if isinstance(module, torch.nn.Parameter):
                out[p + f"self_attn.{theirs}"] = module
            else:
                for leaf, value in module.named_parameters():
                    out[p + f"self_attn.{theirs}.{leaf}"] = value
        mlp = block.mlp
        if c.is_moe_layer(i):
            out[p + "mlp.gate.weight"] = mlp.router.weight
            out[p + "mlp.gate.e_score_correction_bias"] = mlp.router.e_score_correction_bias
            for e, expert in enumerate(mlp.experts):
                for proj in ("gate", "up", "down"):
                    out[p + f"mlp.experts.{e}.{proj}_proj.weight"] = getattr(expert, proj).weight
            for proj in ("gate", "up", "down"):
                out[p + f"mlp.shared_experts.{proj}_proj.weight"] = getattr(mlp.shared, proj).weight
        else:
            for proj in ("gate", "up", "down"):
                out[p + f"mlp.{proj}_proj.weight"] = getattr(mlp, proj).weight
    return {name: t.detach().clone().contiguous() for name, t in out.items()}


def fp8_blocks(weight):
    """The test's own 128x128 block quantisation: (fp8 e4m3 weight, scale_inv [ceil(out/128), ceil(in/128)])."""
    out, inp = weight.shape
    rows, cols = -(-out // 128), -(-inp // 128)
    scale_inv = torch.empty(rows, cols)
    q = torch.empty(out, inp, dtype=torch.float8_e4m3fn)
    for r in range(rows):
        for k in range(cols):
            block = weight[r * 128:(r + 1) * 128, k * 128:(k + 1) * 128].float()
            s = max(block.abs().max().item(), 1e-12) / 448.0
            scale_inv[r, k] = s
            q[r * 128:(r + 1) * 128, k * 128:(k + 1) * 128] = (block / s).to(torch.float8_e4m3fn)
    return q, scale_inv


def write_sharded(tensors, folder, fp8=False):
    """2 shards + model.safetensors.index.json; with ``fp8``, the projections as FP8 + ``<name>_scale_inv``."""
    stored = {}
    for name, t in tensors.items():
        if fp8 and t.dim() == 2 and name.split(".")[-2] in FP8_TARGETS:
            stored[name], stored[name + "_scale_inv"] = fp8_blocks(t)
        else:
            stored[name] = t
    names = sorted(stored)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    folder.mkdir(exist_ok=True)
    for file, part in halves.items():
        save_file({n: stored[n] for n in part}, str(folder / file))
    weight_map = {n: file for file, part in halves.items() for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return stored


def moe_hybrid_config():
    return small_config(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_group=2, topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1)


def tiny_deepseek():
    return dataclasses.replace(load_config("deepseek-v3.2-tiny"), hidden_size=160, vocab_size=300)


@pytest.mark.parametrize("make_config", [tiny_deepseek, moe_hybrid_config], ids=["deepseek-v3.2", "k3-hybrid"])
def test_a_bf16_sharded_checkpoint_loads_exactly(tmp_path, make_config):
    source = init_weights(HybridModel(make_config()), seed=1).eval()
    write_sharded(hand_written_tensors(source), tmp_path / "ckpt")
    target = init_weights(HybridModel(source.config), seed=2).eval()
    report = load_checkpoint(target, tmp_path / "ckpt")
    assert report == {"tensors": len(source.state_dict()), "skipped_mtp": 0}
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name
    tokens = random_prompts([24], source.config.vocab_size)[0]
    assert torch.equal(full_sequence_logits(target, tokens), full_sequence_logits(source, tokens))


@pytest.mark.parametrize("make_config", [tiny_deepseek, moe_hybrid_config], ids=["deepseek-v3.2", "k3-hybrid"])
def test_fp8_block_scaled_weights_are_dequantised_per_128x128_block(tmp_path, make_config):
    source = init_weights(HybridModel(make_config()), seed=1).eval()
    stored = write_sharded(hand_written_tensors(source), tmp_path / "fp8", fp8=True)
    fp8_names = [n for n, t in stored.items() if t.dtype == torch.float8_e4m3fn]
    assert any(stored[n + "_scale_inv"].shape[0] > 1 and stored[n + "_scale_inv"].shape[1] > 1 for n in fp8_names)
    target = HybridModel(source.config)
    load_checkpoint(target, tmp_path / "fp8")
    by_public = {public_name(n, source.config): p for n, p in target.state_dict().items()}
    exact_weights = hand_written_tensors(source)
    for name in fp8_names:  # w = fp8.float() * scale_inv of the weight's block, element by element
        w, q, s = by_public[name], stored[name].float(), stored[name + "_scale_inv"]
        rows = torch.arange(w.shape[0])[:, None] // 128
        cols = torch.arange(w.shape[1])[None, :] // 128
        assert torch.equal(w, q * s[rows, cols]), name
        assert torch.allclose(w, exact_weights[name], rtol=0.07, atol=1e-6), name
    tokens = random_prompts([24], source.config.vocab_size)[0]
    ours, exact = full_sequence_logits(target.eval(), tokens), full_sequence_logits(source, tokens)
    # FP8 weights: near, not equal (by norm: an FP8-perturbed indexer may pick a different token at one position)
    assert (ours - exact).norm() < 0.1 * exact.norm()
    assert not torch.equal(ours, exact)


def test_the_library_writer_uses_the_same_names_and_round_trips(tmp_path):
    source = init_weights(HybridModel(moe_hybrid_config()), seed=3)
    index = save_checkpoint(source, tmp_path / "lib", shards=2)
    assert set(index["weight_map"]) == set(hand_written_tensors(source))
    assert len(set(index["weight_map"].values())) == 2
    fp8_index = save_checkpoint(source, tmp_path / "lib8", shards=3, fp8=True)
    scales = [n for n in fp8_index["weight_map"] if n.endswith("_scale_inv")]
    assert "model.layers.3.self_attn.kv_b_proj.weight_scale_inv" in scales
    assert "model.layers.1.mlp.gate.weight_scale_inv" not in scales  # the router stays in full precision
    assert load_checkpoint(HybridModel(source.config), tmp_path / "lib8")["tensors"] == len(source.state_dict())
    plain = HybridModel(source.config)
    load_checkpoint(plain, tmp_path / "lib")
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), plain.state_dict().values()))


def test_dequantize_uses_each_blocks_own_scale():
    q = torch.ones(130, 260).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    w = dequantize_fp8(q, scale)
    assert (w[0, 0], w[0, 128], w[0, 259], w[128, 0], w[129, 259]) == (1.0, 2.0, 3.0, 4.0, 6.0)


def test_a_mismatch_names_the_tensor_and_both_shapes_and_nothing_is_copied(tmp_path):
    source = init_weights(HybridModel(tiny_deepseek()), seed=1)
    tensors = hand_written_tensors(source)
    tensors["model.layers.1.mlp.experts.3.up_proj.weight"] = torch.zeros(7, 160)
    del tensors["model.layers.2.self_attn.indexer.wk.weight"]
    tensors["model.layers.0.self_attn.rotary.inv_freq"] = torch.zeros(32)
    tensors["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)  # layer num_layers: DeepSeek's MTP module
    write_sharded(tensors, tmp_path / "bad")
    target = init_weights(HybridModel(source.config), seed=2)
    before = {n: p.clone() for n, p in target.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(target, tmp_path / "bad")
    message = str(info.value)
    assert ("tensor 'model.layers.1.mlp.experts.3.up_proj.weight' (model parameter 'blocks.1.mlp.experts.3.up.weight'"
            "): checkpoint shape [7, 160], model expects [64, 160]") in message
    assert "missing tensor 'model.layers.2.self_attn.indexer.wk.weight' (model parameter " \
           "'blocks.2.attn.index_k_proj.weight', shape [128, 160])" in message
    assert "unexpected tensor 'model.layers.0.self_attn.rotary.inv_freq' (checkpoint shape [32])" in message
    assert "eh_proj" not in message and "3 problem(s)" in message
    assert all(torch.equal(before[n], p) for n, p in target.state_dict().items())


def test_an_fp8_weight_without_its_scale_or_with_a_wrong_one_is_refused(tmp_path):
    source = init_weights(HybridModel(tiny_deepseek()), seed=1)
    tensors = hand_written_tensors(source)
    stored = write_sharded(tensors, tmp_path / "a", fp8=True)
    stored.pop("model.layers.0.self_attn.q_b_proj.weight_scale_inv")
    stored["model.layers.0.self_attn.o_proj.weight_scale_inv"] = torch.ones(1, 1)
    save_file(stored, str(tmp_path / "one.safetensors"))
    (tmp_path / "b").mkdir()
    (tmp_path / "one.safetensors").rename(tmp_path / "b" / "model.safetensors")  # one file, no index: also read
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(HybridModel(source.config), tmp_path / "b")
    message = str(info.value)
    assert "'model.layers.0.self_attn.q_b_proj.weight' is FP8 e4m3 but the checkpoint has no " \
           "'model.layers.0.self_attn.q_b_proj.weight_scale_inv'" in message
    assert "tensor 'model.layers.0.self_attn.o_proj.weight_scale_inv': checkpoint shape [1, 1], expected [2, 4]" \
        in message


def test_an_index_naming_a_missing_shard_is_refused(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "nope.safetensors"}}))
    with pytest.raises(CheckpointError, match="names shard files that do not exist"):
        load_checkpoint(HybridModel(tiny_deepseek()), tmp_path)


SMALL_RUN = ["run", "--batch", "2", "--prompt-len", "20", "--decode", "2", "--block-tokens", "16", "--chunk", "16"]


def test_run_loads_sharded_and_fp8_checkpoint_directories(tmp_path, capsys):
    """A K3-style hybrid with MoE layers (a config file): seeded weights written in the public layout load into
    `dsahal run` and give the seeded run's tokens; the FP8 copy passes --check; the wrong preset is refused."""
    config_file = tmp_path / "k3-moe.json"
    config_file.write_text(json.dumps(moe_hybrid_config().to_dict()))
    config = ["--config", str(config_file)]
    model = init_weights(HybridModel(moe_hybrid_config()), seed=0)
    save_checkpoint(model, tmp_path / "w")
    save_checkpoint(model, tmp_path / "w8", fp8=True)
    seeded, loaded = tmp_path / "seeded.json", tmp_path / "loaded.json"
    assert main(SMALL_RUN + config + ["--json", str(seeded)]) == 0
    assert main(SMALL_RUN + config + ["--weights", str(tmp_path / "w"), "--json", str(loaded)]) == 0
    assert json.loads(loaded.read_text())["outputs"] == json.loads(seeded.read_text())["outputs"]
    assert main(SMALL_RUN + config + ["--weights", str(tmp_path / "w8" / "model.safetensors.index.json"),
                                      "--check"]) == 0
    capsys.readouterr()
    assert main(SMALL_RUN + ["--config", "tiny", "--weights", str(tmp_path / "w8")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "tensor 'model.embed_tokens.weight' (model parameter 'embed.weight'): checkpoint " \
        "shape [256, 128], model expects [512, 256]" in err
    assert "Traceback" not in err
