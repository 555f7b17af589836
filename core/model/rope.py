"""Rotary position embedding as the DeepSeek-V3 / Kimi checkpoints define it: YaRN and two layouts.

Frequencies (``dim`` rotated dims, ``dim/2`` pairs, base ``theta``)::

    inv_freq[i] = theta^(-2i / dim)                                      i = 0 .. dim/2 - 1

With YaRN (``rope_scaling = {type: yarn, factor, original_max_position_embeddings, beta_fast,
beta_slow, mscale, mscale_all_dim}``) and ``factor > 1``, the low frequencies are interpolated by
``factor`` and the high ones kept, with a linear ramp between the correction dims of ``beta_fast``
and ``beta_slow`` rotations over the original context (DeepSeek-V3's ``precompute_freqs_cis``)::

    d(r)        = dim · ln(L_orig / (2π r)) / (2 ln theta)
    low, high   = max(floor(d(beta_fast)), 0), min(ceil(d(beta_slow)), dim - 1)
    ramp[i]     = clamp((i - low) / (high - low), 0, 1)          (high += 0.001 when equal)
    inv_freq[i] = inv_freq[i] / factor · ramp[i] + inv_freq[i] · (1 - ramp[i])

and the MLA softmax scale is multiplied by ``m(mscale_all_dim)²`` with
``m(a) = 0.1 · a · ln(factor) + 1`` (1 when ``factor <= 1``). cos and sin carry
``m(mscale) / m(mscale_all_dim)`` (Hugging Face's DeepSeek-V3; 1 in every public config, where the
two are equal). ``factor <= 1`` is plain RoPE.

Layouts of the rotated pairs:

- ``"interleaved"``: pairs ``(x[2i], x[2i+1])`` — how MLA's q_pe / k_pe come out of the real
  weights (DeepSeek-V3.x, Kimi K2);
- ``"rotate_half"``: pairs ``(x[i], x[i + dim/2])`` — DeepSeek-V3.2's indexer (its
  ``apply_rotary_emb(..., interleaved=False)``).

Angles ``position · inv_freq`` are formed in float64 where the device has it (CPU, CUDA): in fp32 a
position of 160K carries an angle error of ~0.01 rad on the fastest pair; cos and sin are fp32.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..ops._dispatch import recording
from . import fused

ROPE_LAYOUTS = ("interleaved", "rotate_half")
YARN_KEYS = ("type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim")


@dataclass(frozen=True)
class Yarn:
    """YaRN parameters as a checkpoint's ``rope_scaling`` gives them (DeepSeek-V3 defaults)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0  # 0: the softmax scale is left alone (Hugging Face's reading)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """``0.1 · mscale · ln(factor) + 1``, or 1 when ``factor <= 1``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_correction_range(beta_fast: float, beta_slow: float, dim: int, theta: float,
                          original_max_positions: int) -> tuple[int, int]:
    """The dims ``(low, high)`` between which YaRN ramps from extrapolation to interpolation."""
    def correction_dim(rotations: float) -> float:
        return dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    return max(math.floor(correction_dim(beta_fast)), 0), min(math.ceil(correction_dim(beta_slow)), dim - 1)


def inv_frequencies(dim: int, theta: float, yarn: Optional[Yarn] = None, device=None,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[dim/2]`` inverse frequencies (computed in float64, returned in ``dtype``), YaRN-corrected when
    ``yarn`` is given with factor > 1."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim))
    if yarn is not None and yarn.factor > 1:
        low, high = yarn_correction_range(yarn.beta_fast, yarn.beta_slow, dim, theta,
                                          yarn.original_max_position_embeddings)
        high = high + 0.001 if low == high else high  # no division by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
        inv_freq = inv_freq / yarn.factor * ramp + inv_freq * (1 - ramp)
    return inv_freq.to(dtype)


def _field_error(owner: str, field: str, expected: str, got) -> ValueError:
    return ValueError(f"{owner}: config field '{field}' expected {expected}, got {got!r}")


def yarn_from_config(config, owner: str = "rope") -> Optional[Yarn]:
    """The config's ``rope_scaling`` (read with ``getattr``, default None) as :class:`Yarn`; None for no
    scaling. Raises ``ValueError`` naming the key for anything but a well-formed YaRN dict."""
    scaling = getattr(config, "rope_scaling", None)
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise _field_error(owner, "rope_scaling", "None or a dict {type: yarn, factor, ...}", scaling)
    unknown = sorted(set(scaling) - set(YARN_KEYS))
    if unknown:
        raise _field_error(owner, "rope_scaling", f"only the keys {list(YARN_KEYS)}", f"unknown keys {unknown}")
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind != "yarn":
        raise _field_error(owner, "rope_scaling.type", "'yarn' (the only scaling the checkpoints use)", kind)
    for key in ("factor", "original_max_position_embeddings"):
        if key not in scaling:
            raise _field_error(owner, f"rope_scaling.{key}", "a number (required for yarn)", None)
    values = {key: scaling[key] for key in YARN_KEYS[2:] if key in scaling}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _field_error(owner, f"rope_scaling.{key}", "a finite number", value)
    if not values["factor"] > 0:
        raise _field_error(owner, "rope_scaling.factor", "> 0", values["factor"])
    original = values["original_max_position_embeddings"]
    if original != int(original) or original < 1:
        raise _field_error(owner, "rope_scaling.original_max_position_embeddings", "an int >= 1", original)
    values["original_max_position_embeddings"] = int(original)
    if not values.get("beta_fast", 32.0) > 0 or not values.get("beta_slow", 1.0) > 0:
        raise _field_error(owner, "rope_scaling.beta_fast/beta_slow", "> 0 (rotations)",
                           (values.get("beta_fast"), values.get("beta_slow")))
    return Yarn(**{key: float(v) if key != "original_max_position_embeddings" else v for key, v in values.items()})


@dataclass(frozen=True)
class Rope:
    """One rotary embedding: ``dim`` rotated dims with base ``theta``, a layout, optional YaRN."""

    dim: int
    theta: float
    layout: str = "interleaved"
    yarn: Optional[Yarn] = None

    def __post_init__(self):
        if self.layout not in ROPE_LAYOUTS:
            raise ValueError(f"Rope: layout expected one of {list(ROPE_LAYOUTS)}, got {self.layout!r}")
        if self.dim <= 0 or self.dim % 2:
            raise ValueError(f"Rope: dim expected an even int > 0 (RoPE rotates pairs), got {self.dim!r}")
        if not self.theta > 1:
            raise ValueError(f"Rope: theta expected > 1, got {self.theta!r}")

    @property
    def angles_key(self) -> tuple:
        """What cos and sin depend on (not the layout): ropes with equal keys share one table per step."""
        return ("rope cos sin", self.dim, self.theta, self.yarn)

    def inv_freq(self, device, dtype: torch.dtype) -> torch.Tensor:
        """``[dim/2]`` :func:`inv_frequencies`, computed once per device and dtype (five launches a step
        saved; not while tracing or capturing a CUDA graph: :func:`~dsahal.ops._dispatch.recording`)."""
        if recording(device):
            return inv_frequencies(self.dim, self.theta, self.yarn, device=device, dtype=dtype)
        key = (self.dim, self.theta, self.yarn, torch.device(device), dtype)
        table = _INV_FREQ.get(key)
        if table is None:
            table = _INV_FREQ[key] = inv_frequencies(self.dim, self.theta, self.yarn, device=device, dtype=dtype)
        return table

    @property
    def attention_factor(self) -> float:
        """The factor on cos and sin: ``m(mscale) / m(mscale_all_dim)`` (1 without YaRN)."""
        if self.yarn is None:
            return 1.0
        return yarn_mscale(self.yarn.factor, self.yarn.mscale) / yarn_mscale(self.yarn.factor, self.yarn.mscale_all_dim)

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, dim/2]`` fp32 for integer ``positions`` ``[T]``."""
        wide = torch.float64 if positions.device.type in ("cpu", "cuda") else torch.float32
        inv_freq = self.inv_freq(positions.device, wide)
        factor = self.attention_factor
        if factor == 1.0 and wide == torch.float64 and positions.stride(-1) == 1 and fused.active(positions):
            return fused.rope_cos_sin(positions, inv_freq)  # one kernel instead of six (dsahal.model.fused)
        angles = positions.to(wide)[:, None] * inv_freq[None, :]
        if factor == 1.0:
            return torch.cos(angles).float(), torch.sin(angles).float()
        return (torch.cos(angles) * factor).float(), (torch.sin(angles) * factor).float()

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x ``[T, ..., dim]``; cos, sin ``[T, dim/2]`` -> x rotated in this layout (x's shape and dtype)."""
        return apply_rope(x, cos, sin, self.layout)


_INV_FREQ: dict = {}  # Rope.inv_freq's tables: (dim, theta, yarn, device, dtype) -> [dim/2]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Rotate each pair ``(a, b)`` of x's last dim to ``(a cos - b sin, b cos + a sin)``, in fp32.

    x: ``[T, ..., dim]``; cos, sin: ``[T, dim/2]``; ``layout`` picks the pairs (module docstring).
    """
    half = x.shape[-1] // 2
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if layout == "rotate_half":
        a, b = x[..., :half].float(), x[..., half:].float()
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)
    if layout == "interleaved":
        pairs = x.float().unflatten(-1, (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2).to(x.dtype)
    raise ValueError(f"apply_rope: layout expected one of {list(ROPE_LAYOUTS)}, got {layout!r}")


def rope_from_config(config, dim: int, layout_field: str, default_layout: str) -> Rope:
    """The :class:`Rope` of ``dim`` dims the config describes: ``rope_theta``, ``rope_scaling`` and the
    layout in ``layout_field`` (all read with ``getattr``; ``default_layout`` when the field is absent)."""
    layout = getattr(config, layout_field, None) or default_layout
    if layout not in ROPE_LAYOUTS:
        raise _field_error("rope", layout_field, f"one of {list(ROPE_LAYOUTS)}", layout)
    return Rope(dim, float(config.rope_theta), layout, yarn_from_config(config))


def mla_softmax_scale(config) -> float:
    """MLA's softmax scale: the config's ``(qk_nope + qk_rope)^-0.5 · mscale²`` times YaRN's
    ``m(mscale_all_dim)²`` (DeepSeek-V3's reading of ``rope_scaling``)."""
    yarn = yarn_from_config(config)
    base = float(config.softmax_scale)
    if yarn is None or not yarn.mscale_all_dim:
        return base
    return base * yarn_mscale(yarn.factor, yarn.mscale_all_dim) ** 2
