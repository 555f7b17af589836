"""The lightning indexer's query side as DeepSeek-V3.2 computes it: Hadamard rotation, FP8 query.

DeepSeek-V3.2's ``Indexer.forward`` (per token, ``Hi`` heads of ``d = 128`` dims)::

    q, k      = RoPE'd q_index [Hi, d], LayerNorm'd, RoPE'd k_index [d]
    q, k      = H q, H k                   H: the Walsh-Hadamard matrix scaled by d^-0.5 (orthonormal)
    q8, s_q   = act_quant(q)               per (token, head): s_q = amax / 448 (rounded up to a power
                                           of two under scale_fmt "ue8m0"), q8 = e4m3(q / s_q)
    w         = W_w x · Hi^-0.5 · s_q · d^-0.5          [Hi]
    score[s]  = Σ_h w[h] · relu(q8[h] · k8[s]) · s_k[s]

The rotation leaves every exact score unchanged (H is orthogonal) but spreads outliers over all
dims before FP8 rounds them, which changes which tokens reach the top-k. The keys are quantised by
the cache's index format when they are written (the ``fp8`` format's power-of-two per-token scale
is ``act_quant`` under "ue8m0"); the query is quantised here, and :func:`dsahal.ops.indexer_score`
takes the float8_e4m3fn query with its scale already folded into the head weights.
"""
from __future__ import annotations

import math

import torch

from ..formats.numerics import FP8_MAX
from ..ops._dispatch import recording

INDEX_SCALE_FORMATS = ("ue8m0", "fp32")
AMAX_FLOOR = 1e-4  # DeepSeek-V3.2's act_quant floor: an all-zero head still gets a finite scale


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """``x · H`` over the last dim (a power of two, n), H the Sylvester Walsh-Hadamard matrix scaled
    by ``n^-0.5`` (``fast_hadamard_transform.hadamard_transform(x, scale=n**-0.5)``, DeepSeek-V3.2's
    ``rotate_activation``). Computed in fp32 (float64 for float64 x) as one matmul with the ±1 matrix, then
    the scale; returns x's shape and dtype.

    One matmul is 4 launches where the log2(n) butterflies of :func:`hadamard_butterfly` are ~50 (dispatches
    counted with their views); the sums run in another order, so results differ from the butterflies' by fp32
    rounding (a few ulp). Where cuBLAS may round fp32 matmuls to TF32 (``allow_tf32``), the butterflies run.

    x: ``[..., n]``.
    """
    n = _power_of_two(x)
    if x.is_cuda and torch.backends.cuda.matmul.allow_tf32:
        return hadamard_butterfly(x)
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.reshape(-1, n).to(wide) @ _sylvester(n, x.device, wide)
    return (y * n ** -0.5).view(x.shape).to(x.dtype)


def hadamard_butterfly(x: torch.Tensor) -> torch.Tensor:
    """:func:`hadamard_rotate` with log2(n) butterflies in fp32 (float64 for float64 x)."""
    n = _power_of_two(x)
    y = x.double() if x.dtype == torch.float64 else x.float()
    lead = y.shape[:-1]
    width = 1
    while width < n:  # butterfly on blocks of 2·width: (a, b) -> (a + b, a - b)
        blocks = y.reshape(*lead, n // (2 * width), 2, width)
        a, b = blocks[..., 0, :], blocks[..., 1, :]
        y = torch.stack([a + b, a - b], dim=-2).reshape(*lead, n)
        width *= 2
    return (y * n ** -0.5).to(x.dtype)


def _power_of_two(x: torch.Tensor) -> int:
    n = x.shape[-1]
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard_rotate: last dim expected a power of two, got {n} (shape {list(x.shape)})")
    return n


_SYLVESTER: dict = {}  # (n, device, dtype) -> the [n, n] ±1 matrix


def _sylvester(n: int, device, dtype: torch.dtype) -> torch.Tensor:
    """The unscaled Sylvester matrix ``H_2m = [[H_m, H_m], [H_m, -H_m]]`` ``[n, n]`` (symmetric; the butterflies'
    order), built once per device and dtype (built inline while tracing or capturing a CUDA graph:
    :func:`~dsahal.ops._dispatch.recording`)."""
    key = (n, torch.device(device), dtype)
    keep = not recording(device)
    matrix = _SYLVESTER.get(key) if keep else None
    if matrix is None:
        matrix = torch.ones((1, 1), dtype=dtype, device=device)
        while matrix.shape[0] < n:
            matrix = torch.cat([torch.cat([matrix, matrix], dim=1), torch.cat([matrix, -matrix], dim=1)])
        if keep:
            _SYLVESTER[key] = matrix
    return matrix


def quantize_query_fp8(q: torch.Tensor, scale_fmt: str = "ue8m0") -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3.2's ``act_quant`` over the last dim: q ``[T, Hi, d]`` -> (q8 ``[T, Hi, d]``
    float8_e4m3fn, s_q ``[T, Hi]`` fp32) with ``q ≈ q8 · s_q``.

    ``scale_fmt``: ``"ue8m0"`` (the checkpoints' setting) rounds ``amax / 448`` up to a power of two
    (the division is then exact and the largest magnitude lands in (224, 448]); ``"fp32"`` keeps it.
    """
    if scale_fmt not in INDEX_SCALE_FORMATS:
        raise ValueError(f"quantize_query_fp8: scale_fmt expected one of {list(INDEX_SCALE_FORMATS)}, "
                         f"got {scale_fmt!r}")
    q32 = q.float()
    amax = q32.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    if scale_fmt == "ue8m0":
        scale = fp8_pow2_scale(amax)
    else:
        scale = amax / FP8_MAX
    q8 = (q32 / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q8, scale


FP8_MAX_MANTISSA, FP8_MAX_EXP = math.frexp(FP8_MAX)  # 448 = 0.875 · 2^9


def fp8_pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """``pow2_scale_at_least(amax, FP8_MAX, min_exp=-126, max_exp=127)`` for ``amax > 0`` (the query's amax is
    floored at :data:`AMAX_FLOOR`), in 8 launches instead of ~30: with ``amax = m · 2^k``, ``m`` in [0.5, 1), the
    smallest ``e`` with ``amax <= 0.875 · 2^(9 + e)`` is ``k - 9``, plus one when ``m > 0.875``; ``2^e`` is then
    built from its exponent bits (exact over [-126, 127], no power or ldexp). fp32 ``[..]`` like ``amax``."""
    mantissa, exponent = torch.frexp(amax.float())
    exp = (exponent - FP8_MAX_EXP).add_((mantissa > FP8_MAX_MANTISSA).to(exponent.dtype)).clamp_(-126, 127)
    return exp.add_(127).bitwise_left_shift_(23).view(torch.float32)


def index_query_and_weights(q: torch.Tensor, raw_weights: torch.Tensor, *, fp8: bool = True,
                            scale_fmt: str = "ue8m0", rotated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer op's query and head weights from the RoPE'd query and ``W_w x``.

    q: ``[T, Hi, d]`` (before the Hadamard rotation); raw_weights: ``[T, Hi]`` (``W_w x``, any float).
    Returns (q_index ``[T, Hi, d]`` float8_e4m3fn, or q's dtype when ``fp8`` is False; weights ``[T, Hi]``
    fp32 ``= W_w x · Hi^-0.5 · d^-0.5`` times s_q when FP8). ``rotated``: q is already Hadamard-rotated.
    """
    heads, dim = q.shape[-2], q.shape[-1]
    weights = raw_weights.float() * (heads ** -0.5 * dim ** -0.5)
    if not rotated:
        q = hadamard_rotate(q)
    if not fp8:
        return q, weights
    q8, scale = quantize_query_fp8(q, scale_fmt)
    return q8, weights.mul_(scale)
