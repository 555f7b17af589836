"""Model configuration of a hybrid KDA + DSA model, and the named presets.

Only the quantities the attention ops, the cache and the planner need are first-class; the rest
(hidden size, MLP width and MoE experts, vocabulary) size the plain-torch parts of the model graph.
"""
from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Optional

LAYER_KINDS = ("kda", "dsa")


@dataclass(frozen=True)
class ModelConfig:
    """A hybrid model. ``layer_kinds`` lists each layer as ``"kda"`` or ``"dsa"`` (MLA + indexer).

    Head counts are totals for the whole model; tensor parallelism divides them.
    """

    name: str
    layer_kinds: tuple[str, ...]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    # MLA (DSA layers)
    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int = 512  # latent "nope" dims: the cached compressed KV
    qk_rope_dim: int = 64
    qk_nope_dim: int = 128
    v_head_dim: int = 128
    mscale: float = 1.0
    # DSA lightning indexer
    index_heads: int = 32
    index_dim: int = 128
    index_topk: int = 2048
    # KDA
    kda_heads: int = 0  # 0: same as num_heads
    kda_head_dim: int = 128
    kda_gate_rank: int = 128  # low-rank channel-wise gate projection
    kda_conv_size: int = 4  # the causal depthwise short convolution on q, k, v (fla's KDA layer)
    # MoE (DeepSeek-V3 routing); n_routed_experts = 0 keeps every layer's MLP dense
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_group: int = 1  # expert groups; routing keeps topk_group of them per token
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0  # the first k layers keep the dense MLP
    # RoPE as the checkpoints' configs give it (read by dsahal.model.rope): YaRN scaling
    # ({type: yarn, factor, original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim};
    # the softmax scale's mscale² comes from mscale_all_dim, so `mscale` above stays 1 when it is set), and
    # the rotation layouts: "interleaved" (adjacent pairs, DeepSeek's MLA weights) or "rotate_half"
    rope_scaling: Optional[dict] = field(default=None, hash=False)
    rope_layout: str = "interleaved"
    index_rope_layout: str = "rotate_half"  # DeepSeek-V3.2's indexer rotates halves (its 2025-11-17 fix)
    index_norm_eps: float = 1e-6
    index_query_fp8: bool = True  # the indexer query in FP8 with its scale folded into the head weights
    index_scale_fmt: str = "ue8m0"  # that scale rounded up to a power of two ("fp32": unrounded)
    # misc
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    notes: str = field(default="", compare=False)

    def __post_init__(self):
        bad = [k for k in self.layer_kinds if k not in LAYER_KINDS]
        if bad:
            raise ValueError(f"ModelConfig {self.name!r}: layer_kinds expected only {LAYER_KINDS}, got {bad}")
        # The split as well as the sum: sparse_mla returns the latent's first 512 dims (the V of MLA's
        # absorbed attention), so 448 + 128 would pass the cache and fail inside the model's einsum.
        if self.kv_lora_rank != 512 or self.qk_rope_dim != 64 or self.index_dim != 128:
            raise ValueError(
                f"ModelConfig {self.name!r}: the cache formats hold a 576-dim latent (512 + 64) and 128-dim "
                f"index keys; got kv_lora_rank={self.kv_lora_rank}, qk_rope_dim={self.qk_rope_dim}, "
                f"index_dim={self.index_dim}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "index_heads", "index_topk",
                     "kda_head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig {self.name!r}: {name} expected > 0, got {getattr(self, name)}")
        if self.kda_heads < 0:  # 0 means num_heads; a negative count made tensors of negative size
            raise ValueError(f"ModelConfig {self.name!r}: kda_heads expected >= 0 (0: same as num_heads), "
                             f"got {self.kda_heads}")
        self._check_moe()

    def _check_moe(self) -> None:
        """The MoE fields fit together (only when the model has routed experts)."""
        def fail(name: str, expected: str) -> None:
            raise ValueError(f"ModelConfig {self.name!r}: {name} expected {expected}, got {getattr(self, name)!r}")

        for name in ("n_routed_experts", "n_shared_experts", "first_k_dense_replace"):
            if getattr(self, name) < 0:
                fail(name, ">= 0")
        experts = self.n_routed_experts
        if experts == 0:
            # Without routed experts every MLP is dense: shared experts or a routing width would be silently
            # dropped (the shared experts live inside the MoE layers), so a config asking for them is refused.
            for name in ("n_shared_experts", "num_experts_per_tok"):
                if getattr(self, name) != 0:
                    fail(name, "0 when n_routed_experts is 0 (no MoE layer: every MLP is the dense "
                               "intermediate_size one)")
            return
        if self.first_k_dense_replace >= self.num_layers:
            fail("first_k_dense_replace", f"< num_layers ({self.num_layers}): with n_routed_experts {experts} at "
                                          f"least one layer routes its experts")
        if not 1 <= self.num_experts_per_tok <= experts:
            fail("num_experts_per_tok", f"between 1 and n_routed_experts ({experts})")
        if self.moe_intermediate_size <= 0:
            fail("moe_intermediate_size", "> 0 (the MoE layers' expert width)")
        if self.n_group < 1 or experts % self.n_group:
            fail("n_group", f">= 1 and dividing n_routed_experts ({experts})")
        if not 1 <= self.topk_group <= self.n_group:
            fail("topk_group", f"between 1 and n_group ({self.n_group})")
        if self.num_experts_per_tok > self.topk_group * (experts // self.n_group):
            fail("num_experts_per_tok", f"<= topk_group x experts per group "
                                        f"({self.topk_group} x {experts // self.n_group}: the experts routing keeps)")
        if not self.routed_scaling_factor > 0:
            fail("routed_scaling_factor", "> 0")

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def dsa_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "dsa"]

    @property
    def kda_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_kinds) if kind == "kda"]

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` has routed experts (DeepSeek-V3: every layer from ``first_k_dense_replace`` on)."""
        return self.n_routed_experts > 0 and index >= self.first_k_dense_replace

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @property
    def kda_num_heads(self) -> int:
        return self.kda_heads or self.num_heads

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_dim

    @property
    def softmax_scale(self) -> float:
        """MLA's scale: ``(qk_nope + qk_rope)^-0.5 · mscale²`` (192^-0.5 for the real models)."""
        return self.mscale * self.mscale / float(self.qk_nope_dim + self.qk_rope_dim) ** 0.5

    def to_dict(self) -> dict:
        data = asdict(self)
        data["layer_kinds"] = list(self.layer_kinds)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        """A config from JSON-like data: every field without a default is required, and the layers are
        given either as ``layer_kinds`` or as ``num_layers`` (with an optional ``layer_pattern``).

        Raises ``ValueError`` naming every unknown or missing key, or a value of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError(f"model config: expected a JSON object of fields, got {type(data).__name__}")
        data = dict(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"layer_pattern", "num_layers"})
        if unknown:
            raise ValueError(f"model config: unknown keys {unknown}; expected some of {sorted(known)}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name != "layer_kinds" and name not in data]
        if "layer_kinds" not in data and "num_layers" not in data:
            missing.append("num_layers (or layer_kinds)")
        if missing:
            raise ValueError(f"model config {data.get('name', '<unnamed>')!r}: missing required keys {missing}")
        if "layer_kinds" in data:  # the layers spelt out: a num_layers or layer_pattern beside them was ignored
            if "layer_pattern" in data:
                raise ValueError(f"model config: expected either layer_kinds or layer_pattern, got both "
                                 f"(layer_pattern {data['layer_pattern']!r})")
            kinds = data["layer_kinds"]
            if "num_layers" in data and isinstance(kinds, (list, tuple)) and data["num_layers"] != len(kinds):
                raise ValueError(f"model config: num_layers expected {len(kinds)} (the length of layer_kinds), "
                                 f"got {data['num_layers']!r}")
        else:
            num_layers = data.pop("num_layers")
            if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
                raise ValueError(f"model config: num_layers expected an int >= 1, got {num_layers!r}")
            data["layer_kinds"] = hybrid_pattern(num_layers, data.pop("layer_pattern", "kkkd"))
        data.pop("layer_pattern", None)
        data.pop("num_layers", None)
        if isinstance(data["layer_kinds"], str) or not isinstance(data["layer_kinds"], (list, tuple)):
            raise ValueError(f"model config: layer_kinds expected a list of 'kda'/'dsa', got {data['layer_kinds']!r}")
        data["layer_kinds"] = tuple(data["layer_kinds"])
        for f in fields(cls):  # JSON gives ints, floats, strings, bools: catch a wrong kind here, by name
            if f.name in data and f.name != "layer_kinds":
                _check_type(f.name, f.type, data[f.name])
        return cls(**data)


_JSON_TYPES = {"int": ((int,), "an int"), "float": ((int, float), "a number"), "str": ((str,), "a string"),
               "bool": ((bool,), "true or false")}


def _check_type(name: str, annotation, value) -> None:
    """``ValueError`` unless ``value`` is of the field's type (``annotation`` is a string: postponed annotations)."""
    if str(annotation) not in _JSON_TYPES:
        return
    expected, words = _JSON_TYPES[str(annotation)]
    if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
        raise ValueError(f"model config: {name} expected {words}, got {value!r}")


def hybrid_pattern(num_layers: int, pattern: str = "kkkd") -> tuple[str, ...]:
    """Repeat a pattern of ``k`` (KDA) and ``d`` (DSA) letters over ``num_layers`` layers
    (a pattern as long as the model spells every layer out)."""
    letters = {"k": "kda", "d": "dsa"}
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(letters):  # JSON may give a number or list
        raise ValueError(f"model config: layer_pattern expected letters 'k' and 'd', got {pattern!r}")
    return tuple(letters[pattern[i % len(pattern)]] for i in range(num_layers))


def list_presets() -> list[str]:
    folder = resources.files("dsahal") / "presets"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def _no_duplicate_keys(pairs: list) -> dict:
    """``json.loads``' object hook: a key given twice is an error (json keeps the last one silently)."""
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"keys given more than once {repeated}")
    return dict(pairs)


def load_config(name_or_path: str) -> ModelConfig:
    """A preset by name (``tiny``, ``k31-pro-slice``, ``k31-pro``) or a JSON file path.

    A ``.json`` path, or any existing file that is not a preset's name, is read as a file; a directory or a
    ``.json`` path that does not exist is a ``ValueError`` saying so (not "unknown preset")."""
    path = Path(name_or_path)
    preset = resources.files("dsahal") / "presets" / f"{name_or_path}.json"
    is_json_path = path.suffix.lower() == ".json"
    if path.is_dir() and (is_json_path or not preset.is_file()):  # a folder named like a preset: the preset
        raise ValueError(f"model config {name_or_path!r} expected a JSON file or one of the presets "
                         f"{list_presets()}, got a directory")
    if path.is_file() and (is_json_path or not preset.is_file()):
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"model config {name_or_path!r}: cannot read the file ({exc})") from None
    elif is_json_path or (os.sep in name_or_path and not preset.is_file()):
        raise ValueError(f"model config {name_or_path!r}: no such file (the presets are {list_presets()})")
    else:
        if not preset.is_file():
            raise ValueError(f"unknown model config {name_or_path!r}: not a JSON file and not one of the presets "
                             f"{list_presets()}")
        text = preset.read_text()
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"model config {name_or_path!r} is not valid JSON: {exc}") from None
    except ValueError as exc:  # a duplicate key (_no_duplicate_keys): which of the two was meant?
        raise ValueError(f"model config {name_or_path!r}: expected each key once, got {exc}") from None
    return ModelConfig.from_dict(data)
