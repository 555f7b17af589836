"""Seeded random initialisation, and save / load with safetensors (no pickle anywhere).

Initialisation keeps activations O(1) through many layers: every linear map draws
``N(0, 1/fan_in)`` (unit-variance in, unit-variance out), the maps that write into the residual
stream (attention and MLP outputs) are further scaled by ``1/sqrt(2 · num_layers)`` so the
residual grows by O(1) over the whole depth, and every norm starts at one. KDA decay parameters
follow flash-linear-attention's initialisation (``exp(A_log)`` in [1, 16], decay steps in
[0.001, 0.1] through softplus). Weights are drawn from one generator on the device the model lives
on: a seed gives the same model on every machine of one device type (drawing a 2.5 G-parameter model
on the host took 21.5 s of a first run on the H200; on the GPU it takes well under a second). Pass
``device="cpu"`` to draw on the host for the same model on every device.
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Callable, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..config import ModelConfig

RESIDUAL_WRITERS = ("attn.o_proj.weight", "mlp.down.weight")
EXPERT_WRITER = ".down.weight"  # under ``.mlp.``: MoE experts' and shared experts' down projections
CONFIG_KEY = "dsahal_config"
MAX_PROBLEMS_SHOWN = 12


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model (missing, unexpected or mis-shaped tensors)."""


def _draw(name: str, param: torch.Tensor, generator: torch.Generator, num_layers: int) -> torch.Tensor:
    shape = tuple(param.shape)
    empty = functools.partial(torch.empty, device=generator.device)
    randn = functools.partial(torch.randn, device=generator.device)
    if name.endswith("A_log"):
        return torch.log(empty(shape).uniform_(1.0, 16.0, generator=generator))
    if name.endswith("dt_bias"):
        dt = torch.exp(empty(shape).uniform_(math.log(1e-3), math.log(0.1), generator=generator))
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    if name.endswith("norm.weight") or name.endswith("_norm.weight"):
        return torch.ones(shape, device=generator.device)
    if name.endswith(".bias") or name.endswith("e_score_correction_bias"):
        return torch.zeros(shape, device=generator.device)
    if name == "embed.weight":
        return randn(shape, generator=generator)
    if len(shape) != 2:
        raise ValueError(f"init_weights: no rule for parameter {name!r} of shape {list(shape)}")
    std = shape[1] ** -0.5
    if name.endswith(RESIDUAL_WRITERS) or (".mlp." in name and name.endswith(EXPERT_WRITER)):
        std /= math.sqrt(2 * num_layers)
    return randn(shape, generator=generator).mul_(std)  # in place: one fp32 temporary at a time


@torch.no_grad()
def init_weights(model: torch.nn.Module, seed: int = 0,
                 progress: Optional[Callable[[str], None]] = None, device=None) -> torch.nn.Module:
    """Fill every parameter of ``model`` (a :class:`~dsahal.model.HybridModel`) from ``seed``; returns it.

    ``device``: where to draw (default: the model's device). ``progress(name)`` is called after each
    parameter is filled (``dsahal run``'s weights bar)."""
    if device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None and first.device.type != "meta" else torch.device("cpu")
    generator = torch.Generator(device=device).manual_seed(seed)
    num_layers = model.config.num_layers
    for name, param in model.named_parameters():  # registration order: stable for a config
        param.copy_(_draw(name, param, generator, num_layers).to(param.dtype))
        if progress is not None:
            progress(name)
    return model


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Write every parameter to a ``.safetensors`` file, with the model config in its metadata."""
    # clone: tied weights share storage, which safetensors refuses to write twice
    tensors = {name: p.detach().to("cpu").clone().contiguous() for name, p in model.state_dict().items()}
    save_file(tensors, str(path), metadata={CONFIG_KEY: json.dumps(model.config.to_dict())})


def checkpoint_config(path: str | Path) -> ModelConfig | None:
    """The config stored in a checkpoint's metadata (None when it has none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        raw = (handle.metadata() or {}).get(CONFIG_KEY)
    return ModelConfig.from_dict(json.loads(raw)) if raw else None


def _config_hint(path, model) -> str:
    """The fields in which the checkpoint's stored config differs from the model's ('' if none stored)."""
    stored = checkpoint_config(path)
    if stored is None:
        return ""
    ours, theirs = model.config.to_dict(), stored.to_dict()
    differ = [f"{key}: checkpoint {theirs[key]!r}, model {ours[key]!r}" for key in ours
              if key != "notes" and ours[key] != theirs.get(key)]
    return ("\nthe configs differ in " + "; ".join(differ)) if differ else ""


@torch.no_grad()
def load_weights(model: torch.nn.Module, path: str | Path,
                 progress: Optional[Callable[[str], None]] = None) -> torch.nn.Module:
    """Load a ``.safetensors`` checkpoint into ``model`` in place (cast to each parameter's dtype); returns it.

    Raises :class:`CheckpointError` (a ``ValueError``) naming every missing, unexpected or
    mis-shaped tensor with both shapes, and the checkpoint's config when it differs.
    ``progress(name)`` is called after each tensor is copied in.
    """
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"load_weights: cannot read {str(path)!r} as safetensors: {exc}") from None
    expected = model.state_dict()
    problems = [f"missing tensor {name!r} (model shape {list(p.shape)})" for name, p in expected.items()
                if name not in tensors]
    problems += [f"unexpected tensor {name!r} (checkpoint shape {list(t.shape)})" for name, t in tensors.items()
                 if name not in expected]
    problems += [f"tensor {name!r}: checkpoint shape {list(tensors[name].shape)}, model expects {list(p.shape)}"
                 for name, p in expected.items() if name in tensors and tensors[name].shape != p.shape]
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more")
        raise CheckpointError(f"load_weights: checkpoint {str(path)!r} does not fit the model "
                              f"({len(problems)} problem(s)):\n  " + "\n  ".join(shown) + _config_hint(path, model))
    for name, target in expected.items():
        target.copy_(tensors[name].to(target.dtype))
        if progress is not None:
            progress(name)
    return model
