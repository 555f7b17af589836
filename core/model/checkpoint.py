"""Public checkpoint layouts: DeepSeek-V3.2 tensor names (and a K3-style KDA + MLA hybrid), sharded
safetensors with a ``model.safetensors.index.json``, FP8 e4m3 weights with 128×128 block scales.

The name mapping (ours -> the checkpoint's; ``N`` a layer, ``E`` an expert)::

    embed.weight                       model.embed_tokens.weight
    final_norm.weight                  model.norm.weight
    lm_head.weight                     lm_head.weight
    blocks.N.attn_norm.weight          model.layers.N.input_layernorm.weight
    blocks.N.mlp_norm.weight           model.layers.N.post_attention_layernorm.weight
    blocks.N.attn.*                    model.layers.N.self_attn.*   with, for MLA + DSA layers,
        q_down q_norm q_up             q_a_proj q_a_layernorm q_b_proj
        kv_down kv_norm kv_up o_proj   kv_a_proj_with_mqa kv_a_layernorm kv_b_proj o_proj
        index_q_up index_k_proj        indexer.wq_b indexer.wk
        index_k_norm index_weights_proj  indexer.k_norm indexer.weights_proj
      and, for KDA layers, flash-linear-attention's ``KimiDeltaAttention`` names:
        q_proj k_proj v_proj o_proj    q_proj k_proj v_proj o_proj
        decay_down decay_up            f_proj.0 f_proj.1        (low-rank decay projection)
        gate_down gate_up              g_proj.0 g_proj.1        (low-rank output gate, bias on .1)
        beta_proj A_log dt_bias o_norm b_proj A_log dt_bias o_norm
      any other attention name is kept as it is under ``self_attn.`` (fla's short convolutions
      ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``: stored ``[D, 1, K]`` as fla's ``nn.Conv1d`` holds them,
      loaded into a ``[D, K]`` parameter)
    blocks.N.mlp.{gate,up,down}        model.layers.N.mlp.{gate,up,down}_proj            (dense layers)
    blocks.N.mlp.router.weight         model.layers.N.mlp.gate.weight                    (MoE layers)
    blocks.N.mlp.router.e_score_correction_bias   model.layers.N.mlp.gate.e_score_correction_bias
    blocks.N.mlp.experts.E.{gate,up,down}         model.layers.N.mlp.experts.E.{gate,up,down}_proj
    blocks.N.mlp.shared.{gate,up,down}            model.layers.N.mlp.shared_experts.{gate,up,down}_proj

The fused layouts are DeepSeek's: ``q_b_proj`` rows per head are (nope, rope), ``kv_a_proj_with_mqa``
rows are (c_kv [512], k_rope [64]), ``kv_b_proj`` rows per head are (W_UK [128], W_UV [128]).

A tensor ``<name>`` stored as ``float8_e4m3fn`` comes with ``<name>_scale_inv`` ``[ceil(out/128),
ceil(in/128)]`` fp32 and is dequantised on load: ``w = fp8.float() · scale_inv`` broadcast over each
128×128 block. The tensors of layer ``num_layers`` (DeepSeek's multi-token-prediction module, not
part of this graph) are skipped and counted; any other tensor the model does not have is an error.
Nothing here was checked against a downloaded checkpoint: the tests write synthetic ones.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .weights import MAX_PROBLEMS_SHOWN, CheckpointError, load_weights

INDEX_FILE = "model.safetensors.index.json"
SCALE_SUFFIX = "_scale_inv"
BLOCK = 128  # FP8 block-scale tile: 128 x 128
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

_TOP = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}
_NORMS = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_MLA = {"q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj", "kv_down": "kv_a_proj_with_mqa",
        "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "index_q_up": "indexer.wq_b",
        "index_k_proj": "indexer.wk", "index_k_norm": "indexer.k_norm", "index_weights_proj": "indexer.weights_proj"}
_KDA = {"decay_down": "f_proj.0", "decay_up": "f_proj.1", "gate_down": "g_proj.0", "gate_up": "g_proj.1",
        "beta_proj": "b_proj"}
_MLP = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.([a-z_]+)\.(.+)")


def public_name(name: str, config) -> str:
    """The checkpoint's name of our parameter ``name`` (the table of the module docstring)."""
    if name in _TOP:
        return _TOP[name]
    match = _BLOCK_NAME.fullmatch(name)
    if not match:
        raise ValueError(f"public_name: parameter {name!r} is not a block's nor one of {sorted(_TOP)}")
    layer, part, rest = int(match.group(1)), match.group(2), match.group(3)
    prefix = f"model.layers.{layer}."
    if part in _NORMS:
        return prefix + f"{_NORMS[part]}.{rest}"
    head, _, tail = rest.partition(".")
    if part == "attn":
        table = _MLA if config.layer_kinds[layer] == "dsa" else _KDA
        return prefix + "self_attn." + ".".join(filter(None, [table.get(head, head), tail]))
    if part == "mlp":
        if head == "router":
            return prefix + f"mlp.gate.{tail}"
        if head == "experts":  # experts.E.gate.weight
            expert, proj, leaf = tail.split(".", 2)
            return prefix + f"mlp.experts.{expert}.{_MLP[proj]}.{leaf}"
        if head == "shared":
            proj, leaf = tail.split(".", 1)
            return prefix + f"mlp.shared_experts.{_MLP[proj]}.{leaf}"
        return prefix + f"mlp.{_MLP[head]}.{tail}"
    raise ValueError(f"public_name: parameter {name!r}: no mapping for block part {part!r}")


def is_public_checkpoint(path: str | Path) -> bool:
    """A directory (sharded or one ``model.safetensors``) or an index JSON: the public layouts' forms."""
    path = Path(path)
    return path.is_dir() or path.name.endswith(".json")


def shard_map(path: str | Path) -> dict[str, Path]:
    """Tensor name -> its shard file, from ``model.safetensors.index.json``'s ``weight_map`` (a directory
    holding one, or the JSON itself), or from every ``*.safetensors`` of a directory without one."""
    path = Path(path)
    index = path / INDEX_FILE if path.is_dir() else path
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"load_checkpoint: {str(index)!r} expected a JSON object with a 'weight_map' "
                                  f"of tensor name -> shard file, got an unreadable one ({exc!r})") from None
        files = {name: index.parent / shard for name, shard in weight_map.items()}
        absent = sorted({str(f) for f in files.values() if not f.is_file()})
        if absent:
            raise CheckpointError(f"load_checkpoint: {str(index)!r} names shard files that do not exist: {absent}")
        return files
    if not path.is_dir():
        raise CheckpointError(f"load_checkpoint: expected a checkpoint directory or its {INDEX_FILE}, "
                              f"got {str(path)!r} (not found)")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"load_checkpoint: directory {str(path)!r} holds no {INDEX_FILE} and no "
                              f"*.safetensors files")
    files = {}
    for shard in shards:
        with _open(shard) as handle:
            files.update({name: shard for name in handle.keys()})
    return files


def _open(shard: Path):
    try:
        return safe_open(str(shard), framework="pt")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"load_checkpoint: cannot read {str(shard)!r} as safetensors: {exc}") from None


def scale_shape(shape) -> list[int]:
    """The block-scale shape ``[ceil(out/128), ceil(in/128)]`` of a 2-D weight's ``shape``."""
    return [math.ceil(shape[0] / BLOCK), math.ceil(shape[1] / BLOCK)]


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """weight ``[out, in]`` float8_e4m3fn, scale_inv ``[ceil(out/128), ceil(in/128)]`` -> ``[out, in]`` fp32."""
    out, inp = weight.shape
    scale = scale_inv.float().repeat_interleave(BLOCK, 0)[:out].repeat_interleave(BLOCK, 1)[:, :inp]
    return weight.float() * scale


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight ``[out, in]`` -> (float8_e4m3fn ``[out, in]``, scale_inv ``[ceil(out/128), ceil(in/128)]`` fp32):
    each 128×128 block scaled so its largest magnitude maps to 448 (e4m3's largest)."""
    out, inp = weight.shape
    rows, cols = scale_shape(weight.shape)
    padded = torch.zeros(rows * BLOCK, cols * BLOCK, dtype=torch.float32)
    padded[:out, :inp] = weight.float()
    amax = padded.view(rows, BLOCK, cols, BLOCK).abs().amax(dim=(1, 3))
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    scale = scale_inv.repeat_interleave(BLOCK, 0)[:out].repeat_interleave(BLOCK, 1)[:, :inp]
    return (weight.float() / scale).to(FP8), scale_inv


def _conv_as_stored(public: str, stored: list[int], shape: list[int]) -> bool:
    """fla's depthwise conv weight ``[D, 1, K]`` for a model parameter ``[D, K]``."""
    return (public.endswith("_conv1d.weight") and len(stored) == 3 and stored[1] == 1
            and [stored[0], stored[2]] == shape)


def _mtp_layer(name: str, num_layers: int) -> bool:
    return name.startswith(f"model.layers.{num_layers}.")


def _plan_load(model, files: dict[str, Path]) -> tuple[dict[str, str], list[str], int]:
    """(our name -> public name, problems, skipped MTP tensors), reading shapes and dtypes only."""
    config = model.config
    names = {ours: public_name(ours, config) for ours in model.state_dict()}
    shapes, dtypes = {}, {}
    for shard in sorted(set(files.values())):
        with _open(shard) as handle:
            present = set(handle.keys())
            for name in [n for n, f in files.items() if f == shard]:
                if name not in present:
                    shapes[name] = None
                    continue
                piece = handle.get_slice(name)
                shapes[name], dtypes[name] = list(piece.get_shape()), piece.get_dtype()
    expected = model.state_dict()
    problems = [f"tensor {n!r}: the index maps it to {str(files[n])!r}, which does not hold it"
                for n in files if shapes[n] is None]
    used = set()
    for ours, public in names.items():
        shape = list(expected[ours].shape)
        if public not in files:
            problems.append(f"missing tensor {public!r} (model parameter {ours!r}, shape {shape})")
            continue
        used.add(public)
        if shapes[public] is not None and shapes[public] != shape and not _conv_as_stored(public, shapes[public],
                                                                                           shape):
            problems.append(f"tensor {public!r} (model parameter {ours!r}): checkpoint shape {shapes[public]}, "
                            f"model expects {shape}")
        scale = public + SCALE_SUFFIX
        if dtypes.get(public) == "F8_E4M3":
            used.add(scale)
            if scale not in files:
                problems.append(f"tensor {public!r} is FP8 e4m3 but the checkpoint has no {scale!r}")
            elif len(shape) != 2 or (shapes[scale] is not None and shapes[scale] != scale_shape(shape)):
                problems.append(f"tensor {scale!r}: checkpoint shape {shapes[scale]}, expected "
                                f"{scale_shape(shape) if len(shape) == 2 else 'a 2-D weight'} (128x128 blocks of "
                                f"the {shape} weight)")
        elif dtypes.get(public, "").startswith("F8"):
            problems.append(f"tensor {public!r}: FP8 dtype {dtypes[public]} is not supported (expected F8_E4M3 "
                            f"with {scale!r}, or a float dtype)")
    mtp = [n for n in files if n not in used and _mtp_layer(n, config.num_layers)]
    problems += [f"unexpected tensor {n!r} (checkpoint shape {shapes[n]})" for n in files
                 if n not in used and not _mtp_layer(n, config.num_layers)]
    return names, problems, len(mtp)


@torch.no_grad()
def load_checkpoint(model: torch.nn.Module, path: str | Path,
                    progress: Optional[Callable[[str], None]] = None) -> dict:
    """Load a checkpoint in the public layout (module docstring) into ``model`` in place.

    ``path``: a directory (with ``model.safetensors.index.json``, or its ``*.safetensors``) or the index
    JSON. FP8 tensors are dequantised; every tensor is cast to its parameter's dtype and device.
    Raises :class:`CheckpointError` naming every missing, unexpected or mis-shaped tensor with both
    shapes, before anything is copied. Returns ``{"tensors": copied, "skipped_mtp": skipped}``.
    """
    files = shard_map(path)
    names, problems, skipped = _plan_load(model, files)
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more")
        raise CheckpointError(f"load_checkpoint: checkpoint {str(path)!r} does not fit the model "
                              f"{model.config.name!r} ({len(problems)} problem(s)):\n  " + "\n  ".join(shown))
    targets = model.state_dict()
    by_shard: dict[Path, list[str]] = {}
    for ours, public in names.items():
        by_shard.setdefault(files[public], []).append(ours)
    for shard, ours_names in sorted(by_shard.items()):
        with _open(shard) as handle:
            for ours in ours_names:
                public = names[ours]
                tensor = handle.get_tensor(public)
                if tensor.dtype == FP8:
                    scale_file = files[public + SCALE_SUFFIX]
                    if scale_file == shard:
                        scale = handle.get_tensor(public + SCALE_SUFFIX)
                    else:
                        with _open(scale_file) as other:
                            scale = other.get_tensor(public + SCALE_SUFFIX)
                    tensor = dequantize_fp8(tensor, scale)
                targets[ours].copy_(tensor.reshape(targets[ours].shape).to(targets[ours].dtype))
                if progress is not None:
                    progress(ours)
    return {"tensors": len(names), "skipped_mtp": skipped}


def load_any(model: torch.nn.Module, path: str | Path, progress: Optional[Callable[[str], None]] = None):
    """``dsahal run --weights``: a public-layout directory or index JSON (:func:`load_checkpoint`), else
    one of our own ``.safetensors`` files (:func:`dsahal.model.weights.load_weights`)."""
    if is_public_checkpoint(path):
        load_checkpoint(model, path, progress)
        return model
    return load_weights(model, path, progress)


def checkpoint_bytes(path: str | Path) -> int:
    """The most host memory loading ``path`` maps at once: the file, or a directory's largest shard."""
    path = Path(path)
    if path.is_file() and not path.name.endswith(".json"):
        return path.stat().st_size
    folder = path if path.is_dir() else path.parent
    return max((f.stat().st_size for f in folder.glob("*.safetensors")), default=0)


def _quantized_in_public_layout(name: str, tensor: torch.Tensor) -> bool:
    """Which weights DeepSeek-V3 stores in FP8: the layers' 2-D projections, not the router, the
    indexer's head weights, norms, embeddings or the LM head."""
    return (tensor.dim() == 2 and name.startswith("model.layers.") and "norm" not in name
            and not name.endswith(("mlp.gate.weight", "weights_proj.weight")))


def save_checkpoint(model: torch.nn.Module, directory: str | Path, shards: int = 2, fp8: bool = False) -> dict:
    """Write ``model`` in the public layout: ``shards`` files ``model-0000i-of-0000n.safetensors`` (tensors in
    order, split by count) and ``model.safetensors.index.json``; ``fp8`` stores the projections as FP8
    e4m3 with 128×128 ``_scale_inv`` blocks. Returns the index (a synthetic checkpoint for tests and
    for ``dsahal run --weights``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for ours, value in model.state_dict().items():
        public, value = public_name(ours, model.config), value.detach().to("cpu").clone().contiguous()
        if public.endswith("_conv1d.weight") and value.dim() == 2:
            value = value.unsqueeze(1)  # fla's nn.Conv1d layout [D, 1, K]
        if fp8 and _quantized_in_public_layout(public, value):
            tensors[public], tensors[public + SCALE_SUFFIX] = quantize_fp8(value)
        else:
            tensors[public] = value
    names = list(tensors)
    per_shard = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for i in range(shards):
        part = {n: tensors[n] for n in names[i * per_shard:(i + 1) * per_shard]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(directory / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in part}
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2))
    return index
