"""The model's elementwise glue as fused Triton kernels on CUDA: fewer launches in the eager decode step.

The eager decode step is bound by host time per dispatched kernel (issue #16 item 4: ~22 us a launch on the H200),
and most of its launches were short elementwise chains around the matmuls and the HAL ops: a norm and its casts, a
gate's activation, RoPE's six products, the indexer's LayerNorm, rotation and FP8 quantisation. Each chain here is
one kernel that computes what the torch chain computes, step by step in fp32 with the chain's rounding points:

* :func:`rms_norm`: (residual add, rounded to x's dtype) + ``RMSNorm`` (+ the cast back);
* :func:`gated_rms_norm`: KDA's ``RMSNorm(o) · sigmoid(gate)``;
* :func:`swiglu`: ``silu(gate) · up``;
* :func:`kda_gates`: KDA's log-decay ``−exp(A_log) · softplus(W x + dt_bias)`` and ``β = sigmoid(W_b x)``;
* :func:`conv_decode`: KDA's short convolution for one token per request, its state read and written in place;
* :func:`rope_cos_sin`: a RoPE table ``cos, sin`` from the positions (angles in float64);
* :func:`mla_query_latent`: MLA's absorbed query and cached latent (RoPE of the query heads and the shared key,
  ``RMSNorm`` of ``c_kv``, the concatenations);
* :func:`indexer_inputs`: the lightning indexer's query and key (the key's LayerNorm, RoPE, the Hadamard
  rotation, the query's FP8 quantisation with its scale folded into the head weights).

Exactness, against the same chain in torch on the same device. Every kernel runs its arithmetic in the chain's order
with floating-point contraction off (``enable_fp_fusion=False``: torch's separate ops round each product), so an
elementwise chain of products, sums and casts is bitwise. What can differ: a reduction's order (the norms' sums of
squares and the LayerNorm's moments, the conv's four taps; the Hadamard rotation runs the butterflies of
``hadamard_butterfly``, where ``hadamard_rotate`` sums by an fp32 matmul: fp32 rounding) and, on
the CPU under the interpreter, the transcendental functions (numpy's exp against torch's; on CUDA the kernels call
libdevice's ``exp`` / ``log1p`` / ``cos`` / ``sin``, which torch's CUDA kernels compile to as well). A bf16 or fp16
result is then within one ulp of its dtype (two where a flipped rounding feeds a second one: ``silu(g)`` rounded,
then its product), an fp32 one within a few fp32 ulp; under the interpreter most 16-bit results come out bitwise
(tests/test_model_fused.py).

Rounding to bf16 is done in integer arithmetic (:func:`_bf16`, round to nearest even), and FP8 encoding likewise
(:func:`_e4m3_bits`): the interpreter's float casts to bf16 and float8 truncate, where the GPU's round; the
integer forms are the same on both.

Which path runs is chosen per call site by :func:`active`: the kernels are switched on (inside :func:`enabled`, or
for the process with :func:`enable_by_default`) and the tensors are CUDA (or, inside :func:`forced_on_host`, CPU
tensors under ``TRITON_INTERPRET=1``), not tracing (``torch.compile`` fuses the torch chains itself), no autograd
through them (the kernels have no backward), float dtypes the kernels take. The CPU path stays the torch chain:
it is what the tests compare the kernels with. Triton is optional: without it every call site runs its chain.
Launches capture in a CUDA graph like any kernel.

**On where compile time is paid later.** The CUDA-graph decode path (:mod:`dsahal.engine.cuda_graph`) switches
the kernels on for its steps: they are captured once, at the first decode, and replay faster (H200, k31-pro-slice,
64 requests at 4K: 1.41 ms a replayed step against 1.91 unfused). Eager steps leave them off unless asked
(:func:`enable_by_default`): their first use compiles ~10 s of kernels, which on a fresh machine pushed ``dsahal
run``'s first token from 13 s to 23-27 s even with the compile warm-up running them on threads of their own,
while an eager step gains 24-48% (5.7-10.0 ms against 10.9-13.3 unfused on the same machine; BENCHMARKS.md,
seventh session).
"""
from __future__ import annotations

import contextlib
import os

import torch

from ..formats.numerics import FP8_MAX
from ..ops._dispatch import tracing
from .indexer import AMAX_FLOOR

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # no Triton: active() is False and every call site runs its torch chain
    triton = tl = libdevice = None

FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_ROUNDING = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the kernels' OUT codes
SOFTPLUS_THRESHOLD = 20.0  # torch's softplus default: above it, softplus(x) = x
_forced = False  # forced_on_host()
_disabled = False  # disabled()
_enabled = 0  # enabled() depth
_by_default = False  # enable_by_default()
# Under the interpreter the kernels use tl.exp & co. (numpy); libdevice has no interpreter form. (Globals a kernel
# reads must be constexpr.)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if tl is not None:
    _INTERPRETING = tl.constexpr(_INTERPRETED)
    _AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)
    _FP8_MAX = tl.constexpr(FP8_MAX)


def _jit(fn):
    return triton.jit(fn) if triton is not None else fn


def active(*tensors: torch.Tensor) -> bool:
    """True where the fused kernels run for a chain over ``tensors`` (the first decides the device): CUDA inside
    :func:`enabled` or after :func:`enable_by_default` (or a CPU tensor inside :func:`forced_on_host`), not
    inside :func:`disabled`, not tracing, no autograd through them, every floating tensor bf16 / fp16 / fp32.
    Cheap: a few attribute reads."""
    first = tensors[0]
    if (triton is None or _disabled
            or not ((first.is_cuda and (_enabled or _by_default)) or (_forced and first.device.type == "cpu"))
            or tracing()):
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if (t.is_floating_point() and t.dtype not in FLOATS) or (grad and t.requires_grad):
            return False
    return True


@contextlib.contextmanager
def enabled():
    """Inside: CUDA call sites take the fused kernels (the CUDA-graph decode path's steps, benchmarks)."""
    global _enabled
    _enabled += 1
    try:
        yield
    finally:
        _enabled -= 1


def enable_by_default(on: bool = True) -> None:
    """Every CUDA call site takes the fused kernels, eager steps too (see the module docstring for the cost)."""
    global _by_default
    _by_default = bool(on)


def on_by_default() -> bool:
    """Whether eager steps take the fused kernels (:func:`enable_by_default`): the compile warm-up then
    compiles them too."""
    return _by_default and triton is not None


@contextlib.contextmanager
def disabled():
    """Inside: every call site runs its torch chain, on CUDA too (to compare or time the two paths)."""
    global _disabled
    saved, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = saved


@contextlib.contextmanager
def forced_on_host():
    """Inside: :func:`active` also takes CPU tensors, the kernels running under Triton's interpreter (tests, and
    ``scripts/h200/model_launches.py --cpu-smoke``, which counts the CUDA path's launches on a CPU). Needs
    ``TRITON_INTERPRET=1`` set before Triton was imported."""
    global _forced
    if triton is None or not _INTERPRETED:
        raise RuntimeError("fused.forced_on_host: expected TRITON_INTERPRET=1 set before triton and dsahal.model "
                           f"were imported, got TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}"
                           + ("" if triton is not None else " and no triton installed"))
    saved, _forced = _forced, True
    try:
        yield
    finally:
        _forced = saved


def _launch(kernel, grid, *args, num_warps: int = 4, **constexprs):
    """``kernel[grid](...)`` with contraction off (module docstring: torch's separate ops round each product)."""
    kernel[grid](*args, num_warps=num_warps, enable_fp_fusion=False, **constexprs)


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


# ---------------------------------------------------------------------------------------------- shared helpers


@_jit
def _bf16(x):
    """fp32 -> the nearest bf16 value (ties to even) as fp32; NaN stays NaN."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@_jit
def _round(x, OUT: tl.constexpr):
    """fp32 x rounded to the output dtype, kept in fp32: OUT 0 fp32 (as is), 1 bf16, 2 fp16."""
    y = x
    if OUT == 1:
        y = _bf16(x)
    elif OUT == 2:
        y = x.to(tl.float16).to(tl.float32)
    return y


# The transcendental functions: libdevice's on a GPU (what torch's CUDA kernels call: expf, log1pf, cos, sin,
# rsqrtf), tl's (numpy's) under the interpreter, which has no libdevice. One return each: the branch is static.


@_jit
def _exp(x):
    if _INTERPRETING:
        y = tl.exp(x)
    else:
        y = libdevice.exp(x)
    return y


@_jit
def _log1p(x):
    if _INTERPRETING:  # no log1p in tl: log(u) · x / (u - 1), u = 1 + x, accurate to a few ulp (Goldberg)
        u = 1.0 + x
        exact = (u == 1.0) | (u == float("inf"))  # there log1p(x) = x (to rounding) / the caller's where drops it
        y = tl.where(exact, x, tl.log(tl.where(exact, 2.0, u)) * tl.math.div_rn(x, tl.where(exact, 1.0, u - 1.0)))
    else:
        y = libdevice.log1p(x)
    return y


@_jit
def _cos(x):
    if _INTERPRETING:
        y = tl.cos(x)
    else:
        y = libdevice.cos(x)
    return y


@_jit
def _sin(x):
    if _INTERPRETING:
        y = tl.sin(x)
    else:
        y = libdevice.sin(x)
    return y


@_jit
def _rsqrt(x):
    if _INTERPRETING:
        y = tl.math.div_rn(1.0, tl.sqrt_rn(x))
    else:
        y = libdevice.rsqrt(x)
    return y


@_jit
def _sigmoid(x):
    """torch's sigmoid: ``1 / (1 + exp(-x))`` (IEEE division)."""
    return tl.math.div_rn(1.0, 1.0 + _exp(-x))


@_jit
def _silu(x):
    """torch's silu: ``x / (1 + exp(-x))``."""
    return tl.math.div_rn(x, 1.0 + _exp(-x))


@_jit
def _rms_scale(x, n, eps):
    """``rsqrt(mean(x²) + eps)`` of a row of fp32 ``x`` (padding lanes zero) over its ``n`` real entries (fp32)."""
    return _rsqrt(tl.math.div_rn(tl.sum(x * x, axis=0), n * 1.0) + eps)


@_jit
def _e4m3_bits(x):
    """fp32 ``x`` (finite, ``|x| <= 448``) -> float8_e4m3fn bit patterns (int32 0..255), round to nearest even,
    subnormals included (as ``backends/triton_kernels/bytes.py``'s codec, which core may not import)."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    field = (bits >> 23) & 0xFF
    significand = (bits & 0x7FFFFF) | tl.where(field > 0, 0x800000, 0)
    lead = tl.maximum(field, 1) - 127
    binade = tl.maximum(lead, -6)
    shift = tl.minimum(20 + binade - lead, 25)
    q = significand >> shift
    rem = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    return (((binade + 6) << 3) + q) | (sign << 7)


@_jit
def _pow2_scale(amax):
    """:func:`dsahal.model.indexer.fp8_pow2_scale` for normal fp32 ``amax > 0``: the smallest power of two
    ``2^e >= amax / 448`` (FP8_MAX), from amax's bits (``amax = m · 2^k``, m in [0.5, 1): e = k − 9, plus one
    when m > 0.875)."""
    bits = amax.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 126
    e = exponent - 9 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    e = tl.minimum(tl.maximum(e, -126), 127)
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@_jit
def _rope_pairs(d, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """For columns ``d`` of a RoPE'd head (only ``d < ROPE`` rotate): (partner column, pair index, +1 for the
    pair's second element / −1 for its first). interleaved pairs ``(2i, 2i + 1)``, rotate-half ``(i, i + ROPE/2)``."""
    if INTERLEAVED:
        partner = d ^ 1
        pair = d // 2
        second = (d & 1) == 1
    else:
        half = ROPE // 2
        second = d >= half
        partner = tl.where(second, d - half, d + half)
        pair = tl.where(second, d - half, d)
    return partner, pair, tl.where(second, 1.0, -1.0)


@_jit
def _rotate(a, b, c, s, sign):
    """One RoPE output: ``a cos - b sin`` (sign −1, the pair's first) or ``a cos + b sin`` (its second: torch's
    ``b cos + a sin`` with the names swapped; a sum is the same either way round), each product rounded."""
    return a * c + sign * (b * s)


# ---------------------------------------------------------------------------------------------------- RMSNorm


@_jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n, stride_x, stride_r, stride_o, stride_s, eps,
                     HAS_RES: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # the residual add, rounded to the stream's dtype (as torch's add), written for the next block
        x = _round(x + tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32), OUT)
        tl.store(sum_ptr + row * stride_s + cols, x.to(sum_ptr.dtype.element_ty), mask=mask)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * _rms_scale(x, n, eps)) * w
    tl.store(out_ptr + row * stride_o + cols, _round(y, OUT).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``RMSNorm``: ``(rms_norm(x.float()) · weight).to(x.dtype)`` over the last dim (:class:`dsahal.model.layers.
    RMSNorm`), x ``[..., N]`` (rows of any stride, unit column stride), weight ``[N]``. With ``residual`` (x's shape
    and dtype): ``s = x + residual`` (rounded to x's dtype) is normalised instead; returns ``(norm(s), s)``."""
    n = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    res2 = _rows(residual) if residual is not None else x2
    block = triton.next_power_of_2(n)
    if x2.shape[0]:
        _launch(_rms_norm_kernel, (x2.shape[0],), x2, res2, weight, out, total, n, x2.stride(0), res2.stride(0), n,
                n, eps, HAS_RES=residual is not None, OUT=_ROUNDING[x.dtype], BLOCK=block, num_warps=_warps(block))
    return out if residual is None else (out, total)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x ``[..., N]`` as a ``[R, N]`` view with unit column stride (a copy only where no such view exists)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x


# ----------------------------------------------------------------------------------------------- KDA's gated norm


@_jit
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, out_ptr, heads, n, sxt, sxh, sgt, sgh, eps,
                           OUT: tl.constexpr, ROUND_NORM: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t, h = (pid // heads).to(tl.int64), (pid % heads).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + t * sxt + h * sxh + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (x * _rms_scale(x, n, eps)) * w
    if ROUND_NORM:  # a 16-bit o: the norm is rounded to it before the gate
        y = _round(y, OUT)
    gate = tl.load(g_ptr + t * sgt + h * sgh + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid.to(tl.int64) * n + cols, _round(y * _sigmoid(gate), OUT).to(out_ptr.dtype.element_ty),
             mask=mask)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`dsahal.model.layers.GatedRMSNorm`: ``RMSNorm(x) · sigmoid(gate)`` per head. x, gate ``[T, H, K]``
    (any strides with a unit last one); weight ``[K]``. Returns ``[T, H, K]`` contiguous, x's dtype."""
    tokens, heads, n = x.shape
    x, gate = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, gate))
    out = torch.empty((tokens, heads, n), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(n)
    if tokens * heads:
        _launch(_gated_rms_norm_kernel, (tokens * heads,), x, gate, weight, out, heads, n, x.stride(0), x.stride(1),
                gate.stride(0), gate.stride(1), eps, OUT=_ROUNDING[x.dtype], ROUND_NORM=x.dtype.itemsize < 4,
                BLOCK=block, num_warps=_warps(block))
    return out


# ------------------------------------------------------------------------------------------------------ SwiGLU


@_jit
def _swiglu_kernel(g_ptr, u_ptr, out_ptr, n, sg, su, OUT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    g = tl.load(g_ptr + row * sg + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * su + cols, mask=mask, other=0.0).to(tl.float32)
    y = _round(_round(_silu(g), OUT) * u, OUT)  # silu(gate) in the gate's dtype, then the product
    tl.store(out_ptr + row * n + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) · up`` (both ``[..., I]``, one dtype; rows of any stride, e.g. the column halves of one packed
    projection). Returns ``[..., I]`` contiguous."""
    n = gate.shape[-1]
    g2, u2 = _rows(gate), _rows(up)
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    block = min(triton.next_power_of_2(n), 2048)
    if g2.shape[0]:
        _launch(_swiglu_kernel, (g2.shape[0], triton.cdiv(n, block)), g2, u2, out, n, g2.stride(0), u2.stride(0),
                OUT=_ROUNDING[gate.dtype], BLOCK=block, num_warps=_warps(block))
    return out


# -------------------------------------------------------------------------------------------------- KDA's gates


@_jit
def _kda_gates_kernel(raw_ptr, bias_ptr, a_ptr, braw_ptr, g_ptr, beta_ptr, heads, k, s_raw, s_braw, threshold,
                      BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < k
    channel = h * k + cols
    raw = tl.load(raw_ptr + t * s_raw + channel, mask=mask, other=0.0).to(tl.float32)
    raw = raw + tl.load(bias_ptr + channel, mask=mask, other=0.0).to(tl.float32)
    softplus = tl.where(raw > threshold, raw, _log1p(_exp(raw)))
    rate = _exp(tl.load(a_ptr + h).to(tl.float32))
    tl.store(g_ptr + (t * heads + h) * k + cols, -rate * softplus, mask=mask)
    beta = _sigmoid(tl.load(braw_ptr + t * s_braw + h).to(tl.float32))
    tl.store(beta_ptr + t * heads + h, beta)


def kda_gates(raw: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, beta_raw: torch.Tensor,
              heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA's gates (:meth:`dsahal.model.kda_layer.KdaLayer.log_decay` and ``sigmoid(beta_raw.float())``).

    raw: ``[T, H·K]`` ``decay_up(decay_down(x))``; dt_bias ``[H·K]``; a_log ``[H]``; beta_raw ``[T, H]`` (rows of
    any stride). Returns (g ``[T, H, K]`` fp32 ``= −exp(A_log) · softplus(raw + dt_bias)``, β ``[T, H]`` fp32)."""
    tokens = raw.shape[0]
    raw = raw if raw.stride(-1) == 1 else raw.contiguous()
    beta_raw = beta_raw if beta_raw.stride(-1) == 1 else beta_raw.contiguous()
    g = torch.empty((tokens, heads, head_dim), dtype=torch.float32, device=raw.device)
    beta = torch.empty((tokens, heads), dtype=torch.float32, device=raw.device)
    block = triton.next_power_of_2(head_dim)
    if tokens:
        _launch(_kda_gates_kernel, (tokens, heads), raw, dt_bias, a_log, beta_raw, g, beta, heads, head_dim,
                raw.stride(0), beta_raw.stride(0), SOFTPLUS_THRESHOLD, BLOCK=block, num_warps=_warps(block))
    return g, beta


# ---------------------------------------------------------------------------------------- KDA's short convolution


@_jit
def _conv_decode_kernel(x_ptr, w_ptr, pool_ptr, ids_ptr, out_ptr, slots, channels, sxb, sxp, sps, spp, spw,
                        OUT: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < channels
    sid = tl.load(ids_ptr + b).to(tl.int64)
    real = (sid >= 0) & (sid < slots)  # -1 (padding): zeros in, nothing written; out of range likewise
    live = tl.where(real, mask, False)  # (not mask & real: the interpreter refuses a scalar in a mask)
    state = pool_ptr + tl.where(real, sid, 0) * sps + p * spp + cols
    weight = w_ptr + (p * channels + cols) * (WIDTH + 1)
    x = tl.load(x_ptr + b * sxb + p * sxp + cols, mask=mask, other=0.0).to(tl.float32)
    # Every tap is read before any is written, each channel by one thread: the in-place shift is safe.
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(WIDTH):
        tap = tl.load(state + j * spw, mask=live, other=0.0)
        product = tap * tl.load(weight + j, mask=mask, other=0.0).to(tl.float32)
        if j == 0:  # oldest tap first, as the torch sum on the CPU
            acc = product
        else:
            acc = acc + product
            tl.store(state + (j - 1) * spw, tap, mask=live)
    acc = acc + x * tl.load(weight + WIDTH, mask=mask, other=0.0).to(tl.float32)
    tl.store(state + (WIDTH - 1) * spw, x, mask=live)
    tl.store(out_ptr + (b * tl.num_programs(1) + p) * channels + cols, _round(_silu(acc), OUT)
             .to(out_ptr.dtype.element_ty), mask=mask)


def conv_decode(x: torch.Tensor, weight: torch.Tensor, conv_pool: torch.Tensor,
                state_ids: torch.Tensor) -> torch.Tensor:
    """:func:`dsahal.model.short_conv.conv_decode` in one kernel: x ``[B, P, C]`` (unit channel stride);
    weight ``[P, C, W]`` contiguous; conv_pool ``[S, P, W − 1, C]`` fp32 (unit channel stride; updated in place at
    ``state_ids`` ``[B]``, −1: padding, reads zeros and writes nothing). Returns ``silu(conv)`` ``[B, P, C]`` in x's
    dtype."""
    batch, projections, channels = x.shape
    width = conv_pool.shape[2]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty((batch, projections, channels), dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(channels), 1024)
    if batch:
        _launch(_conv_decode_kernel, (batch, projections, triton.cdiv(channels, block)), x, weight, conv_pool,
                state_ids, out, conv_pool.shape[0], channels, x.stride(0), x.stride(1), conv_pool.stride(0),
                conv_pool.stride(1), conv_pool.stride(2), OUT=_ROUNDING[x.dtype], WIDTH=width, BLOCK=block,
                num_warps=_warps(block))
    return out


def conv_weight_ok(weight: torch.Tensor, conv_pool: torch.Tensor) -> bool:
    """What :func:`conv_decode` needs of its weight and pool (else the torch path runs)."""
    return (weight.is_contiguous() and conv_pool.dtype == torch.float32 and conv_pool.stride(-1) == 1
            and conv_pool.shape[2] >= 1 and weight.shape[-1] == conv_pool.shape[2] + 1)


# --------------------------------------------------------------------------------------------------- RoPE table


@_jit
def _rope_table_kernel(pos_ptr, freq_ptr, cos_ptr, sin_ptr, half, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < half
    angle = tl.load(pos_ptr + t).to(tl.float64) * tl.load(freq_ptr + cols, mask=mask, other=0.0)
    tl.store(cos_ptr + t * half + cols, _cos(angle).to(tl.float32), mask=mask)
    tl.store(sin_ptr + t * half + cols, _sin(angle).to(tl.float32), mask=mask)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`dsahal.model.rope.Rope.cos_sin` with no attention factor: positions ``[T]`` (int), inv_freq
    ``[dim/2]`` float64 -> (cos, sin) ``[T, dim/2]`` fp32 of the float64 angles ``position · inv_freq``."""
    tokens, half = positions.shape[0], inv_freq.shape[0]
    cos = torch.empty((tokens, half), dtype=torch.float32, device=positions.device)
    sin = torch.empty((tokens, half), dtype=torch.float32, device=positions.device)
    if tokens:
        _launch(_rope_table_kernel, (tokens,), positions, inv_freq, cos, sin, half,
                BLOCK=triton.next_power_of_2(half))
    return cos, sin


# -------------------------------------------------------------------------------- MLA's absorbed query and latent


@_jit
def _mla_query_latent_kernel(nope_ptr, qr_ptr, ckv_ptr, kr_ptr, w_ptr, cos_ptr, sin_ptr, q_ptr, lat_ptr,
                             heads, rank, snt, snh, sqt, sqh, sct, skt, eps,
                             OUT: tl.constexpr, INTERLEAVED: tl.constexpr, ROPE: tl.constexpr,
                             BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    width = rank + ROPE
    d = tl.arange(0, ROPE)
    partner, pair, sign = _rope_pairs(d, ROPE, INTERLEAVED)
    c = tl.load(cos_ptr + t * (ROPE // 2) + pair)
    s = tl.load(sin_ptr + t * (ROPE // 2) + pair)
    cols = tl.arange(0, BLOCK_R)
    mask = cols < rank
    if h < heads:  # a query head: [W_UKᵀ q_nope, RoPE(q_rope)]
        row = q_ptr + (t * heads + h) * width
        nope = tl.load(nope_ptr + t * snt + h * snh + cols, mask=mask)
        tl.store(row + cols, nope.to(q_ptr.dtype.element_ty), mask=mask)
        rope = qr_ptr + t * sqt + h * sqh
    else:  # the latent: [RMSNorm(c_kv), RoPE(k_rope)]
        row = lat_ptr + t * width
        ckv = tl.load(ckv_ptr + t * sct + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (ckv * _rms_scale(ckv, rank, eps)) * w
        tl.store(row + cols, _round(y, OUT).to(lat_ptr.dtype.element_ty), mask=mask)
        rope = kr_ptr + t * skt
    a = tl.load(rope + d).to(tl.float32)
    b = tl.load(rope + partner).to(tl.float32)
    tl.store(row + rank + d, _round(_rotate(a, b, c, s, sign), OUT).to(q_ptr.dtype.element_ty))


def mla_query_latent(q_nope_absorbed: torch.Tensor, q_rope: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
                     norm_weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor,
                     interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA's absorbed query ``[T, H, R + D]`` = ``[q_nope_absorbed, RoPE(q_rope)]`` and cached latent ``[T, R + D]``
    = ``[RMSNorm(c_kv), RoPE(k_rope)]`` (:meth:`dsahal.model.mla_layer.MlaLayer.forward`), both in the inputs' dtype.

    q_nope_absorbed ``[T, H, R]``, q_rope ``[T, H, D]``, c_kv ``[T, R]``, k_rope ``[T, D]``: any strides with a
    unit last one (views of the projections); norm_weight ``[R]``; cos, sin ``[T, D/2]`` fp32 contiguous."""
    tokens, heads, rank = q_nope_absorbed.shape
    rope = q_rope.shape[-1]
    dtype = q_rope.dtype
    q = torch.empty((tokens, heads, rank + rope), dtype=dtype, device=q_rope.device)
    latent = torch.empty((tokens, rank + rope), dtype=dtype, device=q_rope.device)
    block = triton.next_power_of_2(rank)
    if tokens:
        _launch(_mla_query_latent_kernel, (tokens, heads + 1), q_nope_absorbed, q_rope, c_kv, k_rope, norm_weight,
                cos, sin, q, latent, heads, rank, q_nope_absorbed.stride(0), q_nope_absorbed.stride(1),
                q_rope.stride(0), q_rope.stride(1), c_kv.stride(0), k_rope.stride(0), eps, OUT=_ROUNDING[dtype],
                INTERLEAVED=interleaved, ROPE=rope, BLOCK_R=block, num_warps=_warps(block))
    return q, latent


def mla_inputs_ok(q_nope_absorbed, q_rope, c_kv, k_rope, cos) -> bool:
    """What :func:`mla_query_latent` needs (else the torch path runs): unit last strides, one dtype, a power-of-two
    RoPE width, a contiguous fp32 table."""
    parts = (q_nope_absorbed, q_rope, c_kv, k_rope)
    rope = q_rope.shape[-1]
    return (all(p.stride(-1) == 1 and p.dtype == q_rope.dtype for p in parts) and rope >= 2 and rope & (rope - 1) == 0
            and 2 * cos.shape[-1] == rope and cos.is_contiguous() and cos.dtype == torch.float32)


# ----------------------------------------------------------------------------------------- the indexer's inputs


@_jit
def _hadamard(x, ROWS: tl.constexpr, DIM: tl.constexpr, LOG2_DIM: tl.constexpr):
    """x ``[ROWS, DIM]`` times the unscaled Sylvester matrix, as :func:`dsahal.model.indexer.hadamard_butterfly`
    computes it: log2(DIM) butterflies ``(a, b) -> (a + b, a − b)`` on blocks of ``2w`` columns, w = 1, 2, 4...
    (the same adds in the same order: bitwise the butterflies; the fp32 matmul of ``hadamard_rotate`` sums in
    another order). No dot: an fp32 FMA dot of [64, 128] x [128, 128] spilled 11 KB a thread on sm_90."""
    for stage in tl.static_range(LOG2_DIM):
        pairs = tl.permute(tl.reshape(x, (ROWS, DIM >> (stage + 1), 2, 1 << stage)), (0, 1, 3, 2))
        a, b = tl.split(pairs)  # the first and second w columns of each block
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (ROWS, DIM))
    return x


@_jit
def _indexer_kernel(q_ptr, k_ptr, lnw_ptr, lnb_ptr, cos_ptr, sin_ptr, raww_ptr, qo_ptr, ko_ptr, wo_ptr,
                    heads, sqt, sqh, skt, swt, ln_eps, weight_scale, hadamard_scale,
                    OUT: tl.constexpr, FP8: tl.constexpr, POW2: tl.constexpr, INTERLEAVED: tl.constexpr,
                    ROPE: tl.constexpr, DIM: tl.constexpr, LOG2_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_H)[:, None]  # rows 0 .. heads - 1: the query's heads; row `heads`: the shared key
    d = tl.arange(0, DIM)[None, :]
    roped = d < ROPE
    partner, pair, sign = _rope_pairs(d, ROPE, INTERLEAVED)
    partner = tl.where(roped, partner, d)
    is_q = r < heads
    qrow = q_ptr + t * sqt + r * sqh
    x = tl.load(qrow + d, mask=is_q, other=0.0).to(tl.float32)
    xp = tl.load(qrow + partner, mask=is_q & roped, other=0.0).to(tl.float32)
    # The key: LayerNorm (rounded to the dtype), at d and at its RoPE partner, with one row's moments.
    k = tl.load(k_ptr + t * skt + tl.arange(0, DIM)).to(tl.float32)
    mean = tl.math.div_rn(tl.sum(k, axis=0), DIM * 1.0)
    centred = k - mean
    rstd = _rsqrt(tl.math.div_rn(tl.sum(centred * centred, axis=0), DIM * 1.0) + ln_eps)
    kd = tl.load(k_ptr + t * skt + d).to(tl.float32)
    kp = tl.load(k_ptr + t * skt + partner).to(tl.float32)
    kd = _round((kd - mean) * rstd * tl.load(lnw_ptr + d).to(tl.float32) + tl.load(lnb_ptr + d).to(tl.float32), OUT)
    kp = _round((kp - mean) * rstd * tl.load(lnw_ptr + partner).to(tl.float32)
                + tl.load(lnb_ptr + partner).to(tl.float32), OUT)
    is_k = r == heads
    x = tl.where(is_k, kd, x)
    xp = tl.where(is_k, kp, xp)
    # RoPE on the first ROPE dims (rounded to the dtype, as the rotation's .to(x.dtype)), the rest as they are.
    c = tl.load(cos_ptr + t * (ROPE // 2) + pair, mask=roped, other=1.0)
    s = tl.load(sin_ptr + t * (ROPE // 2) + pair, mask=roped, other=0.0)
    x = tl.where(roped, _round(_rotate(x, xp, c, s, sign), OUT), x)
    # The Hadamard rotation (Sylvester's matrix, unscaled), then the scale.
    y = _round(_hadamard(x, BLOCK_H, DIM, LOG2_DIM) * hadamard_scale, OUT)
    tl.store(ko_ptr + t * DIM + d + r * 0, y.to(ko_ptr.dtype.element_ty), mask=is_k)  # the key's row only
    raw = tl.load(raww_ptr + t * swt + r, mask=is_q, other=0.0).to(tl.float32) * weight_scale  # [BLOCK_H, 1]
    if FP8:
        amax = tl.maximum(tl.max(tl.abs(y), axis=1, keep_dims=True), _AMAX_FLOOR)
        if POW2:
            scale = _pow2_scale(amax)
        else:
            scale = tl.math.div_rn(amax, _FP8_MAX)
        scaled = tl.minimum(tl.maximum(tl.math.div_rn(y, scale), -_FP8_MAX), _FP8_MAX)
        tl.store(qo_ptr + (t * heads + r) * DIM + d, _e4m3_bits(scaled).to(tl.uint8), mask=is_q)
        raw = raw * scale
    else:
        tl.store(qo_ptr + (t * heads + r) * DIM + d, y.to(qo_ptr.dtype.element_ty), mask=is_q)
    tl.store(wo_ptr + t * heads + r, raw, mask=is_q)


def indexer_inputs(q: torch.Tensor, index_k: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor,
                   ln_eps: float, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool, raw_weights: torch.Tensor,
                   *, fp8: bool, scale_fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The indexer's (q_index, k_index, weights) as :meth:`dsahal.model.mla_layer.MlaLayer.fused_indexer_inputs`
    computes them: q ``[T, Hi, d]`` (``index_q_up(c_q)``), index_k ``[T, d]`` (``index_k_proj(x)``; LayerNorm'd
    here with ln_weight, ln_bias ``[d]``), both RoPE'd on their first ``cos.shape[1] · 2`` dims and Hadamard-rotated;
    raw_weights ``[T, Hi]`` (``index_weights_proj(x)``). Returns q_index ``[T, Hi, d]`` (float8_e4m3fn with ``fp8``,
    else q's dtype), k_index ``[T, d]`` q's dtype, weights ``[T, Hi]`` fp32 (``raw · Hi^-0.5 · d^-0.5``, times the
    query's scale with ``fp8``; ``scale_fmt`` "ue8m0": power-of-two scales, "fp32": amax / 448)."""
    tokens, heads, dim = q.shape
    rope = 2 * cos.shape[1]
    dtype = q.dtype
    q_out = torch.empty((tokens, heads, dim), dtype=torch.float8_e4m3fn if fp8 else dtype, device=q.device)
    k_out = torch.empty((tokens, dim), dtype=dtype, device=q.device)
    weights = torch.empty((tokens, heads), dtype=torch.float32, device=q.device)
    if tokens:
        _launch(_indexer_kernel, (tokens,), q, index_k, ln_weight, ln_bias, cos, sin, raw_weights,
                q_out.view(torch.uint8) if fp8 else q_out, k_out, weights, heads, q.stride(0), q.stride(1),
                index_k.stride(0), raw_weights.stride(0), ln_eps, heads ** -0.5 * dim ** -0.5, dim ** -0.5,
                OUT=_ROUNDING[dtype], FP8=fp8, POW2=scale_fmt == "ue8m0", INTERLEAVED=interleaved, ROPE=rope,
                DIM=dim, LOG2_DIM=dim.bit_length() - 1, BLOCK_H=triton.next_power_of_2(heads + 1), num_warps=4)
    return q_out, k_out, weights


def indexer_inputs_ok(q, index_k, raw_weights, cos) -> bool:
    """What :func:`indexer_inputs` needs (else the torch path runs): unit last strides, one dtype, a power-of-two
    head dim, RoPE dims a power of two within it."""
    dim, rope = q.shape[-1], 2 * cos.shape[-1]
    return (all(p.stride(-1) == 1 for p in (q, index_k, raw_weights)) and index_k.dtype == q.dtype
            and 2 <= dim <= 1024 and dim & (dim - 1) == 0 and 2 <= rope <= dim and rope & (rope - 1) == 0
            and cos.is_contiguous() and cos.dtype == torch.float32)


# Last: every launched kernel above goes through the launch cache (dsahal.kernel_launch: Triton's own launch
# costs 3-6 us more host time per kernel, 18% of the eager decode step on the H200; BENCHMARKS.md).
if triton is not None:
    from ..kernel_launch import wrap_launched

    wrap_launched(globals())
