"""The contract every cache format implements: bytes per token, pack, unpack, error bound.

A format turns one token's vector (``dim`` values) into a fixed-size byte record
(``token_bytes``) stored in a page, and back. Pages are ``uint8`` tensors
``[num_blocks, block_tokens, token_bytes]``; kernels reinterpret the bytes in place.

Shared rules of every format:

- ``pack`` rejects NaN and ±Inf with a ``ValueError`` (a block-scaled format would otherwise turn
  one bad value into a whole block of NaN, silently).
- Finite values beyond what the format can hold saturate to its largest magnitude (never to Inf or
  NaN); :meth:`CacheFormat.max_abs` says where that starts, per dim.
- ``error_bound`` is valid for every finite input, saturation included:
  ``|unpack(pack(x)) - x| <= error_bound(x)`` elementwise.
- ``unpack(pack(v)) == v`` exactly when ``v`` is itself an unpacked record (re-packing what a cache
  holds loses nothing), and ``-0.0`` keeps its sign.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .numerics import FP32_MAX

FLOAT_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class CacheFormat:
    """One storage format of the latent cache (``kind="latent"``) or the index-key cache (``kind="index"``).

    Subclasses implement :meth:`encode`, :meth:`decode`, :meth:`bound` and :meth:`max_abs`; the public
    :meth:`pack`, :meth:`unpack` and :meth:`error_bound` validate their arguments first.
    ``needs_tensor_scale`` is True when the format is scaled by one external fp32 scale per
    tensor (FP8 per-tensor latent); the scale is then passed to every op that reads or writes it.
    """

    name: str
    kind: str
    dim: int
    token_bytes: int
    needs_tensor_scale: bool = False
    # Largest tensor scale the format accepts (formats with ``needs_tensor_scale``): ops and the cache check it.
    max_tensor_scale: ClassVar[float] = math.inf

    # -- public, validated -------------------------------------------------------------------------
    def pack(self, values: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """values ``[N, dim]`` (fp32/fp16/bf16/fp64, finite) -> records ``[N, token_bytes]`` uint8 (on the meta
        device: an empty meta tensor of that shape, for shape inference; the values' dtype and shape still checked)."""
        self._check_values("pack", values)
        self._check_scale("pack", scale)
        if self._meta("pack", values, scale):  # shape inference (fake tensors): the records' shape, no bytes
            return torch.empty((values.shape[0], self.token_bytes), dtype=torch.uint8, device="meta")
        return self.encode(values, scale)

    def unpack(self, records: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """records ``[N, token_bytes]`` uint8 -> values ``[N, dim]`` float32 (meta records: an empty meta tensor)."""
        self._check_records(records)
        self._check_scale("unpack", scale)
        if self._meta("unpack", records, scale):
            return torch.empty((records.shape[0], self.dim), dtype=torch.float32, device="meta")
        return self.decode(records, scale)

    def error_bound(self, values: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``[N, dim]`` fp32 with ``|unpack(pack(x)) - x| <= bound`` elementwise, for any finite x; always finite.

        The per-format terms (rounding + saturation excess + division slack) can sum past the fp32 range for
        ``|x|`` near fp32's largest value; the cap is still a bound: ``unpack(pack(x))`` is finite and has x's
        sign (or is zero), so the error is at most ``max(|x|, |unpack(pack(x))|) <= FP32_MAX``."""
        self._check_values("error_bound", values)
        self._check_scale("error_bound", scale)
        if self._meta("error_bound", values, scale):
            return torch.empty((values.shape[0], self.dim), dtype=torch.float32, device="meta")
        return self.bound(values, scale).clamp_max(FP32_MAX)

    # -- per format --------------------------------------------------------------------------------
    def encode(self, values: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, records: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def bound(self, values: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def max_abs(self, scale: torch.Tensor | None = None) -> torch.Tensor:
        """``[dim]`` fp32: per dim, the largest magnitude stored without saturating."""
        raise NotImplementedError

    # -- checks ------------------------------------------------------------------------------------
    def _where(self, method: str) -> str:
        return f"dsahal.formats.{self.kind}:{self.name}.{method}"

    def _check_values(self, method: str, values: object) -> None:
        where = self._where(method)
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"{where}: argument 'values' expected a torch.Tensor, got {type(values).__name__}")
        if values.dtype not in FLOAT_INPUT_DTYPES:
            raise TypeError(f"{where}: argument 'values' expected a float32/float16/bfloat16/float64 tensor, "
                            f"got {values.dtype}")
        if values.dim() != 2 or values.shape[1] != self.dim:
            raise ValueError(f"{where}: argument 'values' expected shape [N, {self.dim}], got {list(values.shape)}")
        if values.device.type == "meta":  # no values to check: shape inference only
            return
        finite = torch.isfinite(values)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            raise ValueError(f"{where}: argument 'values' expected finite values (NaN/Inf cannot be stored), "
                             f"got {bad} non-finite value(s)")

    def _check_records(self, records: object) -> None:
        where = self._where("unpack")
        if not isinstance(records, torch.Tensor):
            raise TypeError(f"{where}: argument 'records' expected a torch.Tensor, got {type(records).__name__}")
        if records.dtype != torch.uint8:
            raise TypeError(f"{where}: argument 'records' expected dtype uint8, got {records.dtype}")
        if records.dim() != 2 or records.shape[1] != self.token_bytes:
            raise ValueError(f"{where}: argument 'records' expected shape [N, {self.token_bytes}], "
                             f"got {list(records.shape)}")

    def _check_scale(self, method: str, scale: object) -> None:
        where = self._where(method)
        if not self.needs_tensor_scale:
            if scale is not None:
                raise ValueError(f"{where}: argument 'scale' expected None (format {self} has no tensor scale), "
                                 f"got a {type(scale).__name__}")
            return
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"{where}: argument 'scale' expected a float32 tensor of one element, "
                            f"got {type(scale).__name__}")
        if scale.dtype != torch.float32 or scale.numel() != 1:
            raise TypeError(f"{where}: argument 'scale' expected a float32 tensor of one element, "
                            f"got {scale.dtype} of shape {list(scale.shape)}")
        if scale.device.type == "meta":  # no value to check: shape inference only
            return
        value = float(scale)
        if not self.accepts_scale(value):
            raise ValueError(f"{where}: argument 'scale' expected a finite value > 0{scale_limit_text(self)}, "
                             f"got {value}")

    def _meta(self, method: str, data: torch.Tensor, scale: torch.Tensor | None) -> bool:
        """Whether this call is shape inference (``data`` on the meta device); a scale must then be meta too,
        and real when the data is."""
        meta = data.device.type == "meta"
        if scale is not None and (scale.device.type == "meta") != meta:
            raise ValueError(f"{self._where(method)}: argument 'scale' expected on the meta device exactly when the "
                             f"data is (shape inference), got scale on {scale.device} and data on {data.device}")
        return meta

    def accepts_scale(self, value: float) -> bool:
        """A tensor scale this format takes: finite, > 0 and at most :attr:`max_tensor_scale` (the one rule
        the format's own methods, the ops' validation and the cache's ``set_latent_scale`` apply)."""
        return 0.0 < value < math.inf and value <= self.max_tensor_scale

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


def scale_limit_text(fmt: CacheFormat) -> str:
    """`` and at most <limit> (...)`` for messages about a tensor scale with a finite upper limit, else ``""``."""
    if math.isinf(fmt.max_tensor_scale):
        return ""
    return f" and at most {fmt.max_tensor_scale:.6g} (format {fmt} holds up to 448 * scale, which must be a finite fp32)"


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Reinterpret the last dim of a contiguous tensor as bytes: ``[N, d]`` -> ``[N, d*itemsize]`` uint8."""
    return t.contiguous().view(torch.uint8)


def from_bytes(records: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`as_bytes`: ``[N, b]`` uint8 -> ``[N, b/itemsize]`` of ``dtype``.

    Reinterpreting bytes needs the first byte at a multiple of the item size; records cut from a byte buffer
    (a transfer blob, a slice at an odd offset) need not be, so those are copied to fresh storage first."""
    records = records.contiguous()
    if records.storage_offset() % dtype.itemsize:
        records = records.clone()  # fresh storage, offset 0
    return records.view(dtype)


def saturation_excess(values: torch.Tensor, limit: torch.Tensor | float) -> torch.Tensor:
    """``max(|x| - limit, 0)`` in fp32: the extra error of a value clamped to ``±limit``."""
    return (values.abs().float() - limit).clamp_min(0.0)
