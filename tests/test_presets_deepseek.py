"""The deepseek-v3.2 presets: the public dims, the parameter count they add up to, and `dsahal plan` for them."""
import json

import torch

from dsahal.cli import main
from dsahal.config import list_presets, load_config
from dsahal.model import HybridModel


def test_deepseek_v32_has_the_public_dims():
    c = load_config("deepseek-v3.2")
    assert (c.num_layers, c.dsa_layers, c.kda_layers) == (61, list(range(61)), [])
    assert (c.hidden_size, c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_dim, c.qk_rope_dim,
            c.v_head_dim, c.vocab_size) == (7168, 128, 1536, 512, 128, 64, 128, 129280)
    assert (c.index_heads, c.index_dim, c.index_topk) == (64, 128, 2048)
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts, c.moe_intermediate_size,
            c.n_group, c.topk_group, c.routed_scaling_factor) == (256, 8, 1, 2048, 8, 4, 2.5)
    assert c.moe_layers == list(range(3, 61))


def test_deepseek_v32_adds_up_to_its_published_671b_parameters():
    """DeepSeek-V3's 671 B (without the 14 B multi-token-prediction module), plus V3.2's indexers."""
    with torch.device("meta"):
        model = HybridModel(load_config("deepseek-v3.2"))
    total = sum(p.numel() for p in model.parameters())
    assert 671e9 <= total <= 673e9, total
    expert = model.blocks[3].mlp.experts[0]
    assert sum(p.numel() for p in expert.parameters()) == 3 * 7168 * 2048


def test_the_tiny_variant_keeps_the_structure():
    tiny = load_config("deepseek-v3.2-tiny")
    assert {"deepseek-v3.2", "deepseek-v3.2-tiny"} <= set(list_presets())
    assert tiny.kda_layers == [] and tiny.moe_layers == [1, 2] and tiny.n_group > 1 and tiny.n_shared_experts == 1
    assert load_config("k31-pro").moe_layers == [] and "no expert counts" in load_config("k31-pro").notes


def test_plan_lays_out_the_all_dsa_cache(capsys):
    assert main(["plan", "--config", "deepseek-v3.2", "--memory-gib", "80", "--context", "128k", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["config"]["dsa_layers"] == 61 and plan["config"]["kda_layers"] == 0
    # every DSA layer holds one latent page and one index page in the row, and no layer a KDA state
    pages = plan["layout"]["pages"]
    assert len(pages) == 2 * 61 and {p["kind"] for p in pages} == {"latent", "index"}
    assert plan["layout"]["states"] == [] and plan["layout"]["state_bytes"] == 0


def test_an_all_dsa_model_runs_end_to_end_with_no_kda_state(tmp_path):
    """DeepSeek-V3.2 has no KDA layer: the engine's requests need no state slot."""
    import json

    from dsahal.cli import main

    out = tmp_path / "run.json"
    code = main(["run", "--config", "deepseek-v3.2-tiny", "--batch", "2", "--prompt-len", "8", "--decode", "2",
                 "--check", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["stats"]["decode_tokens"] == 2 and report["check"]["passed"] is True
