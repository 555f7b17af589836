"""KDA prefill in chunks of 16 tokens: a token-parallel pass, then a head-parallel recurrence.

Same contract as :func:`.kda.kda_prefill_recurrent` (and ``dsahal.reference.kda.kda_prefill``): packed
sequences ``cu_seqlens [B + 1]``, sequence ``b`` starts from ``state_pool[state_ids[b]]`` (id -1, or out of
range: from zero, and writes nothing) and writes its final state back there in place, through the pool's
strides. Design and cost model: ``docs/kda-prefill.md``.

Per chunk of C = 16 tokens from state ``S₀ [K, V]`` (``G_i = Σ_{j≤i} g_j`` per channel, from the chunk's
start; see ``dsahal.reference.kda`` for the derivation)::

    A    = β ⊙ strictly-lower(K_i · K_j e^{G_i − G_j})      T = (I + A)⁻¹ = (I − A)(I + A²)(I + A⁴)(I + A⁸)
    w    = T (β k e^{G})      u = T (β v)      v_new = u − w S₀          (A¹⁶ = 0: the series is exact)
    o    = qg S₀ + A_qk v_new,   qg = scale q e^{G},   A_qk = scale · lower(Q_i · K_j e^{G_i − G_j})
    S_C  = e^{G_C} ⊙ S₀ + kgᵀ v_new,   kg = k e^{G_C − G}

**Pass A** (:func:`kda_chunk_prepare_kernel`, program = one chunk x one head, grid ``(T // 16 + B, H)``):
loads q, k, v, g, beta of its 16 tokens once, L2-normalises q and k, forms the in-chunk cumulative gate
in fp32, and the pairwise decays ``e^{G_i − G_j}`` as a product of two factors relative to the chunk's
token 8 (``MID``: every factor spans at most 8 gates, and the growing ones are the ≤ 8 before it), so
A and A_qk are one ``[16, K] x [K, 16]`` MMA each. Writes w, kg, qg ``[16, K]``, uᵀ ``[V, 16]``,
A_qkᵀ ``[16, 16]`` (operand dtype) and ``e^{G_C}`` ``[K]`` (fp32) to the scratch buffer. A chunk's
sequence is found in the kernel, by a binary search of ``cu_seqlens``: sequence ``b``'s chunk ``j`` has
slot ``cu[b] // 16 + b + j`` (injective, and below ``T // 16 + B``), so there is no host-built chunk
list and no host sync; the few slots between sequences are idle programs.

**Pass B** (:func:`kda_chunk_state_kernel`, program = one sequence x head x V slab of ``BLOCK_V``,
grid ``(cdiv(V, BLOCK_V), B * H)``): holds the state slab on chip as ``Sᵀ [BLOCK_V, K]`` fp32 for the
whole sequence, reading it once from ``state_pool[state_ids[b]]`` and writing it back once. Per chunk,
in the V-first (transposed) form so every MMA has ``M = BLOCK_V`` however few tokens the chunk has::

    v_newᵀ = uᵀ − Sᵀ wᵀ;   oᵀ = Sᵀ qgᵀ + v_newᵀ A_qkᵀ;   Sᵀ ← Sᵀ ⊙ e^{G_C} + v_newᵀ kg

A sequence whose length is not a multiple of 16 ends in a partial chunk: its missing tokens load as
k = q = v = beta = g = 0, so their rows of w, u, kg are zero and they change nothing.

**Numerics.** Gates are clamped below at ``GATE_MIN = -10`` per token (a one-token decay below 4.5e-5
becomes 4.5e-5; the doc's bound is -11): with 8-gate spans the largest factor is e^{80} = 5.5e34, which
leaves a factor ~6,000 under fp32's maximum for the magnitudes of q and k's components when
``use_qk_l2norm`` is off (-11 would leave 2). The clamp changes a result by at most ~e^{-10} of a
state term that a clamped token decays, far below bf16's resolution (and fp16's). The inverse's
products are fp32 (``ieee``). ``operands`` sets the other MMAs' operand dtype and the scratch's:

* ``"tf32"`` (the nvidia route ``triton_chunk``, forced only): A and A_qk in fp32 (``pair``: FMA dots or
  three tf32 MMAs), every other MMA on tf32 operands (10-bit mantissa, fp32 range), fp32 scratch. Why not bf16 throughout (fla's choice):
  a row whose output is small against its two terms (the state's ``qg S₀`` and the chunk's
  ``A_qk v_new`` nearly cancel, as the delta rule makes them) loses the operands' relative error
  times that ratio. A float64 emulation of each rounding point over 600 random conformance-suite cases
  (bf16 inputs, K 16-64, all three decays): bf16 everywhere failed the suite's normwise 2⁻⁶ on 28% of
  them (worst 0.27; the H200 run of the suite failed four properties on it); the bf16 roundings of A_qk's
  and A's operands are most of it (tf32 there is not enough: 1%), then ``qg`` and the state as the
  operands of ``qg S₀``; this mode: none failed, worst 3.3e-3 (the reference's own bf16 output rounding
  is 3.1e-3).
* ``"mixed"`` (the nvidia route ``triton_chunk_mixed``, the default for 16-bit prefill calls over 512
  tokens): A and A_qk in fp32, ``qg`` kept fp32 in the scratch and ``qg S₀`` on tf32 operands, every other
  MMA and scratch tensor bf16 (half the scratch bytes of ``"tf32"`` for w, kg, uᵀ, A_qkᵀ). Same emulation,
  800 cases: none failed, worst 1.1e-2 (0.7 of the bound); the H200 conformance suite passes it at 200
  examples in both modes. 1.3x faster than ``"tf32"`` on the H200.
* ``"bf16"``: bf16 operands and scratch, fp32 accumulation and state, as fla; fails the suite's bound on
  small rows (above).
* ``"fp32"``: fp32 operands with ``input_precision="ieee"``: within fp32 rounding of the recurrence (of the
  clamped gates). The Triton interpreter's tests use it (its bf16 dots are not bf16). Not a serving path:
  on sm_90 its FMA dots spill (pass B at ``BLOCK_V = 64``: 6.5 KB of stack; local Triton 3.9 compile).
* ``"fp16"``: as bf16 with fp16's 11-bit mantissa and ±65504 range: the interpreter's test of the
  reduced-precision code path (the casts, a 16-bit scratch); overflows where a decay factor exceeds 65504
  (spans beyond 11 in log space), so it is not for serving.

**Schedule options** (none changes a result beyond the rounding each names; the ``nvidia`` mixed default turns all
on, BENCHMARKS.md "Fourteenth session"; pass A always stores each output as soon as it is formed and loads v
last, 247 -> 180 registers): ``prepare_maxnreg`` (ptxas's cap: 168 gives three programs a SM); ``scan_mma``
(the cumulative gate as one MMA of the lower-triangular ones by the gates instead of ``tl.cumsum`` across warps:
exact for 16-bit gates, ``tf32x3`` for fp32 ones); ``inverse`` (the inverse's six products as ``ieee`` FMA dots,
``tf32``, ``tf32x3`` or ``bf16x3`` MMAs); ``longest_first`` (pass B's programs start with the longest sequences').

**Scratch** (one ``torch.uint8`` buffer per call, ``S = T // 16 + B`` slots x ``H`` heads, ``BK`` / ``BV``
= K / V rounded up to a power of two, at least 16, ``e`` = the scratch dtype's size, ``e_q`` = qg's: 4 in
``"mixed"``, else ``e``)::

    S · H · ((2 · 16 · BK + 16 · BV + 256) · e + 16 · BK · e_q + 4 · BK)  bytes

(8 x 4096 tokens, 32 heads, K = V = 128: 2,056 slots; bf16 1,088 B per token-head, 1.15 GB; tf32 2.3 GB.)

Batch invariance: pass B's step order is fixed per sequence (chunks start at the sequence's first token),
so a sequence's result does not depend on the others in the call.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .alignment import aligned_rows
from .kda import _TOKEN_ARGS, _check_state_pool, sequence_ranges
from .limits import kda_gate
from dsahal.kernel_launch import wrap_launched

CHUNK = 16
MID = 8  # the token whose cumulative gate the chunk's decay factors are relative to (see the docstring)
GATE_MIN = -10.0
MAX_DIM = 128  # K and V: the pass-A tiles ([16, 128] fp32 per tensor) sized for 4 warps
# operands -> (the kernels' OPERAND code, the scratch dtype, qg's scratch dtype); docstring's Numerics
PAIRS = {"ieee": 0, "tf32x3": 1, "bf16x3": 2}  # how the tf32 and mixed modes form A and A_qk (see _mm_pair)
OPERANDS = {"fp32": (0, torch.float32, torch.float32), "bf16": (1, torch.bfloat16, torch.bfloat16),
            "fp16": (2, torch.float16, torch.float16), "tf32": (3, torch.float32, torch.float32),
            "mixed": (4, torch.bfloat16, torch.float32)}


# The arguments whose alignment facts are the same whichever rows a batch holds (compile_budget: batch-invariant mode
# keeps them): the state pool (the cache), K and V, and the output pass B writes (allocated by the launcher, its
# strides H x V and V); and those the launcher aligns on every call: the token tensors
# (:func:`~.alignment.aligned_rows`) and the scratch regions (one allocation, each region a multiple of 16 bytes).
# With neither, pass B's sm_90 compile in batch-invariant mode was the fully generic twin's, 255 registers and a
# 440-byte spill against 242 and none (thirty-first session, ``python -m dsahal.backends.nvidia.aot --invariant``);
# with them the default compile's SASS.
_SCRATCH_ARGS = ("w_ptr", "kg_ptr", "qg_ptr", "u_ptr", "aqk_ptr", "decay_ptr")
CACHE_ARGS = {"kda_chunk_prepare_kernel": ("K", "V", "stride_bh"),
              "kda_chunk_state_kernel": ("state_ptr", "stride_sp", "stride_sh", "stride_sk", "K", "V", "out_ptr",
                                         "stride_on", "stride_oh")}
LAUNCHER_ALIGNED_ARGS = {"kda_chunk_prepare_kernel": _TOKEN_ARGS + _SCRATCH_ARGS,
                         "kda_chunk_state_kernel": _SCRATCH_ARGS}


@triton.jit
def _mm(a, b, OPERAND: tl.constexpr):
    """``a @ b`` with fp32 accumulation; operands fp32 (``ieee``), bf16, fp16, tf32, bf16 as ``OPERAND`` is
    0 .. 4 (the module docstring's ``operands``)."""
    if OPERAND == 0:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif OPERAND == 2:
        out = tl.dot(a.to(tl.float16), b.to(tl.float16))
    elif OPERAND == 3:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    return out


@triton.jit
def _mm_pair(a, b, OPERAND: tl.constexpr, PAIR: tl.constexpr):
    """The chunk's pair products A and A_qk: fp32 in the tf32 and mixed modes (their operands' rounding is
    what a bf16 chunked form loses most to), by FMA dots (``PAIR`` 0, ``ieee``), three tf32 MMAs on a
    hi/lo split of each operand (``PAIR`` 1, ``tf32x3``: ~21 of fp32's 24 bits, on the tensor cores) or
    three bf16 MMAs on a bf16 hi/lo split (``PAIR`` 2, ``bf16x3``: hi·hi + hi·lo + lo·hi, ~16 bits, the
    dropped lo·lo term below 2⁻¹⁶ of the product; bf16 MMAs run at twice tf32's rate on half the operand
    bytes, and pass A is bound by shared-memory traffic); else as :func:`_mm`."""
    if OPERAND >= 3:
        if PAIR == 2:
            a_hi = a.to(tl.bfloat16)
            b_hi = b.to(tl.bfloat16)
            a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)
            b_lo = (b - b_hi.to(tl.float32)).to(tl.bfloat16)
            out = tl.dot(a_lo, b_hi, tl.dot(a_hi, b_lo))  # the small terms first, then the large one
            out = tl.dot(a_hi, b_hi, out)
        elif PAIR == 1:
            out = tl.dot(a, b, input_precision="tf32x3")
        else:
            out = tl.dot(a, b, input_precision="ieee")
    else:
        out = _mm(a, b, OPERAND)
    return out


@triton.jit
def _mm_state_query(a, b, OPERAND: tl.constexpr):
    """``Sᵀ qgᵀ``, the state's part of the output: tf32 operands in the tf32 and mixed modes."""
    if OPERAND >= 3:
        out = tl.dot(a, b.to(tl.float32), input_precision="tf32")
    else:
        out = _mm(a, b, OPERAND)
    return out


@triton.jit
def _mm_inverse(a, b, INV: tl.constexpr):
    """One product of the Neumann-series inverse (16 x 16 fp32 tiles): FMA dots (``INV`` 0, ``ieee``), three
    tf32 MMAs on a hi/lo split (1, ``tf32x3``), three bf16 MMAs on a hi/lo split (2, ~16 bits: w and u are
    written in the scratch dtype, bf16 in the mixed mode, so T needs no more), one tf32 MMA (3)."""
    if INV == 1:
        out = tl.dot(a, b, input_precision="tf32x3")
    elif INV == 2:
        a_hi = a.to(tl.bfloat16)
        b_hi = b.to(tl.bfloat16)
        a_lo = (a - a_hi.to(tl.float32)).to(tl.bfloat16)
        b_lo = (b - b_hi.to(tl.float32)).to(tl.bfloat16)
        out = tl.dot(a_hi, b_hi, tl.dot(a_lo, b_hi, tl.dot(a_hi, b_lo)))
    elif INV == 3:
        out = tl.dot(a, b, input_precision="tf32")
    else:
        out = tl.dot(a, b, input_precision="ieee")
    return out


@triton.jit
def kda_chunk_prepare_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr,  # q, k, g [T, H, K]; v [T, H, V]; beta [T, H] (token-major)
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_gn, stride_gh, stride_bn, stride_bh,
    cu_ptr,  # [B + 1] token offsets
    w_ptr, kg_ptr, qg_ptr,  # scratch [S, H, 16, BLOCK_K] (scratch dtype; qg fp32 in the mixed mode)
    u_ptr,  # scratch [S, H, BLOCK_V, 16]: uᵀ
    aqk_ptr,  # scratch [S, H, 16, 16]: A_qkᵀ
    decay_ptr,  # scratch [S, H, BLOCK_K] fp32: e^{G_C}
    B, H, K, V, scale, search_steps,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, C: tl.constexpr, M: tl.constexpr, GATE_LO: tl.constexpr,
    L2NORM: tl.constexpr, OPERAND: tl.constexpr, PAIR: tl.constexpr, INV: tl.constexpr = 0,
    SCAN: tl.constexpr = 0,
):
    """Pass A: grid ``(T // C + B, H)``; program (slot, head). ``search_steps`` >= log2(B) + 1. ``INV``: how the
    inverse's products are formed (:func:`_mm_inverse`); ``SCAN`` 1: the in-chunk cumulative gate as one MMA
    of the inclusive lower-triangular ones by the clamped gates (exact: the gates are values of their own
    16-bit input dtype, the accumulation fp32), else ``tl.cumsum``. Each output is stored as soon as it is formed
    and v is loaded last: fewer ``[16, K]`` tiles live at once (247 -> 180 registers in the mixed mode)."""
    slot = tl.program_id(0)
    h = tl.program_id(1)
    # The sequence b owning this slot: the largest b with cu[b] // C + b <= slot (strictly increasing in b).
    lo = slot * 0
    hi = lo + B - 1
    for _ in range(search_steps):
        mid = (lo + hi + 1) // 2
        first = (tl.load(cu_ptr + mid) // C + mid).to(tl.int32)
        take = first <= slot
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid - 1)
    start = tl.load(cu_ptr + lo).to(tl.int64)
    end = tl.load(cu_ptr + lo + 1).to(tl.int64)
    chunk_start = start + (slot - (start // C + lo)) * C
    n_valid = tl.minimum(end - chunk_start, C)
    if n_valid > 0:  # else a slot between two sequences: nothing to do
        ts = tl.arange(0, C)
        ks = tl.arange(0, BLOCK_K)
        vs = tl.arange(0, BLOCK_V)
        t_ok = ts < n_valid
        tok = chunk_start + ts
        km = t_ok[:, None] & (ks < K)[None, :]
        vm = t_ok[:, None] & (vs < V)[None, :]
        q = tl.load(q_ptr + tok[:, None] * stride_qn + h * stride_qh + ks[None, :], mask=km, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + tok[:, None] * stride_kn + h * stride_kh + ks[None, :], mask=km, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + tok[:, None] * stride_gn + h * stride_gh + ks[None, :], mask=km, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + tok * stride_bn + h * stride_bh, mask=t_ok, other=0.0).to(tl.float32)
        if L2NORM:
            q = q / tl.sqrt(tl.sum(q * q, axis=1) + 1e-6)[:, None]
            k = k / tl.sqrt(tl.sum(k * k, axis=1) + 1e-6)[:, None]
        gc = tl.maximum(g, GATE_LO)  # missing tokens add 0
        if SCAN == 1:  # G = L · g with L the inclusive lower-triangular ones (a scan across warps costs more)
            gate = _gate_mix(tl.where(ts[:, None] >= ts[None, :], 1.0, 0.0), gc, g_ptr)
        else:
            gate = tl.cumsum(gc, axis=0)  # G [C, BLOCK_K]
        g_mid = tl.sum(tl.where((ts == M)[:, None], gate, 0.0), axis=0)  # G_M [BLOCK_K]
        g_last = tl.sum(tl.where((ts == C - 1)[:, None], gate, 0.0), axis=0)  # G_C (= the last real token's)
        rel = gate - g_mid[None, :]
        grow = tl.exp(rel)  # e^{G_i − G_M}: row factor
        shrink = tl.exp(-rel)  # e^{G_M − G_j}: column factor; their product is e^{G_i − G_j}
        k_col = k * shrink
        lower = ts[:, None] > ts[None, :]
        base = slot.to(tl.int64) * H + h
        # a slot's [C, BLOCK_K] tile: its int64 start (a scalar) plus int32 offsets in it (not an int64 tile,
        # which holds two registers an element for the whole pass)
        slot_off = base * (C * BLOCK_K)
        tile = ts[:, None] * BLOCK_K + ks[None, :]
        # Each output stored as soon as it is formed, v loaded last (fewer tiles live). Whole tiles, unmasked:
        # missing tokens' rows and padded channels are zeros by construction. The upper triangle's pair products
        # may overflow (e^{G_i − G_j} > 1 for j > i): selected away, never scaled.
        decayed = tl.exp(gate)  # e^{G_i} <= 1
        tl.store(kg_ptr + slot_off + tile, (k * tl.exp(g_last[None, :] - gate)).to(kg_ptr.dtype.element_ty))
        tl.store(decay_ptr + base * BLOCK_K + ks, tl.exp(g_last))
        a_qk = tl.where(lower | (ts[:, None] == ts[None, :]),
                        _mm_pair(q * grow, tl.trans(k_col), OPERAND, PAIR) * scale, 0.0)
        tl.store(aqk_ptr + base * (C * C) + ts[None, :] * C + ts[:, None], a_qk.to(aqk_ptr.dtype.element_ty))
        tl.store(qg_ptr + slot_off + tile, (q * (decayed * scale)).to(qg_ptr.dtype.element_ty))
        a = tl.where(lower, _mm_pair(k * grow, tl.trans(k_col), OPERAND, PAIR) * beta[:, None], 0.0)
        k_beta = k * (decayed * beta[:, None])
        inv = _unit_lower_inverse(a, ts, INV)
        tl.store(w_ptr + slot_off + tile, _mm(inv, k_beta, OPERAND).to(w_ptr.dtype.element_ty))
        v = tl.load(v_ptr + tok[:, None] * stride_vn + h * stride_vh + vs[None, :], mask=vm, other=0.0).to(
            tl.float32)
        u = _mm(inv, v * beta[:, None], OPERAND)
        tl.store(u_ptr + base * (BLOCK_V * C) + vs[None, :] * C + ts[:, None], u.to(u_ptr.dtype.element_ty))


@triton.jit
def _unit_lower_inverse(a, ts, INV: tl.constexpr):
    """T = (I + A)⁻¹ = (I − A)(I + A²)(I + A⁴)(I + A⁸) for a strictly lower-triangular ``A [C, C]`` fp32
    (exact: A¹⁶ = 0), its products as :func:`_mm_inverse` forms them."""
    eye = tl.where(ts[:, None] == ts[None, :], 1.0, 0.0)
    a2 = _mm_inverse(a, a, INV)
    a4 = _mm_inverse(a2, a2, INV)
    a8 = _mm_inverse(a4, a4, INV)
    inv = _mm_inverse(eye - a, eye + a2, INV)
    inv = _mm_inverse(inv, eye + a4, INV)
    return _mm_inverse(inv, eye + a8, INV)


@triton.jit
def _gate_mix(coefficients, gates, g_ptr):
    """``coefficients [C, C] @ gates [C, BLOCK_K]`` in fp32 (``gates``: the clamped gates as fp32 values): for 16-bit
    gates one MMA in their own dtype (the coefficients 0 / 1 and the gates are exact there, the sums fp32); fp32
    gates (the model's) and fp64 ones (loaded as fp32, as everywhere in this kernel) as three tf32 MMAs on a hi/lo
    split (``tf32x3``: each gate to ~22 of its 24 bits, ~2^-22 relative, the sums fp32)."""
    g_type = g_ptr.dtype.element_ty
    if g_type == tl.float16 or g_type == tl.bfloat16:
        out = tl.dot(coefficients.to(g_type), gates.to(g_type))
    else:
        out = tl.dot(coefficients, gates, input_precision="tf32x3")
    return out


@triton.jit
def kda_chunk_state_kernel(
    w_ptr, kg_ptr, qg_ptr, u_ptr, aqk_ptr, decay_ptr,  # pass A's scratch (layouts in its signature)
    out_ptr, stride_on, stride_oh,  # [T, H, V]
    state_ptr, stride_sp, stride_sh, stride_sk,  # state pool [P, H, K, V] fp32 (unit stride in V)
    ids_ptr,  # [B] state ids
    cu_ptr,  # [B + 1] token offsets
    order_ptr,  # [B] int32: the sequences in the order their programs start (LONGEST_FIRST), else unused
    H, K, V, P, seq0,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, SCRATCH_V: tl.constexpr, C: tl.constexpr,
    OPERAND: tl.constexpr, LONGEST_FIRST: tl.constexpr = False,
):
    """Pass B: grid ``(cdiv(V, BLOCK_V), B' * H)`` for sequences ``seq0 .. seq0 + B' - 1`` (B' = B unless
    B x H passes grid axis 1's cap); program (V slab, sequence x head)."""
    pid_v = tl.program_id(0)
    seq = seq0 + tl.program_id(1) // H
    if LONGEST_FIRST:  # programs start in grid order: the longest chains of steps first, not last
        seq = tl.load(order_ptr + seq)
    h = tl.program_id(1) % H
    ks = tl.arange(0, BLOCK_K)
    vs = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)  # < SCRATCH_V: both powers of two, BLOCK_V <= SCRATCH_V
    ts = tl.arange(0, C)
    k_ok = ks < K
    v_ok = vs < V
    # The id is broadcast to the slab's V lanes: masks are then plain tensors (the interpreter mishandles
    # tensor & scalar masks), as in kda.py.
    sid = tl.load(ids_ptr + seq + 0 * vs).to(tl.int64)
    live = (sid >= 0) & (sid < P)
    slab_ok = v_ok[:, None] & k_ok[None, :] & live[:, None]
    # h as int64: a strided pool's head stride can be large (kda.py's recurrent kernel: h * stride_sh wraps int32)
    slab = state_ptr + tl.where(live, sid, 0)[:, None] * stride_sp + h.to(tl.int64) * stride_sh \
        + ks[None, :] * stride_sk \
        + vs[:, None]
    state_t = tl.load(slab, mask=slab_ok, other=0.0)  # Sᵀ [BLOCK_V, BLOCK_K] fp32
    start = tl.load(cu_ptr + seq).to(tl.int64)
    end = tl.load(cu_ptr + seq + 1).to(tl.int64)
    first_slot = start // C + seq
    for c in range(0, (end - start + C - 1) // C):
        base = (first_slot + c) * H + h
        tile = base * (C * BLOCK_K)
        w_t = tl.load(w_ptr + tile + ts[None, :] * BLOCK_K + ks[:, None])  # wᵀ [BLOCK_K, C]
        qg_t = tl.load(qg_ptr + tile + ts[None, :] * BLOCK_K + ks[:, None])  # qgᵀ [BLOCK_K, C]
        kg = tl.load(kg_ptr + tile + ts[:, None] * BLOCK_K + ks[None, :])  # kg [C, BLOCK_K]
        u_t = tl.load(u_ptr + base * (SCRATCH_V * C) + vs[:, None] * C + ts[None, :]).to(tl.float32)  # [BLOCK_V, C]
        aqk_t = tl.load(aqk_ptr + base * (C * C) + ts[:, None] * C + ts[None, :])  # A_qkᵀ [C, C]
        decay = tl.load(decay_ptr + base * BLOCK_K + ks)  # e^{G_C} [BLOCK_K]
        v_new_t = u_t - _mm(state_t, w_t, OPERAND)  # [BLOCK_V, C]
        o_t = _mm_state_query(state_t, qg_t, OPERAND) + _mm(v_new_t, aqk_t, OPERAND)
        state_t = state_t * decay[None, :] + _mm(v_new_t, kg, OPERAND)
        tok = start + c * C + ts
        tl.store(out_ptr + tok[None, :] * stride_on + h * stride_oh + vs[:, None],
                 o_t.to(out_ptr.dtype.element_ty), mask=(tok < end)[None, :] & v_ok[:, None])
    tl.store(slab, state_t, mask=slab_ok)


def _block(dim: int) -> int:
    return max(16, triton.next_power_of_2(dim))  # tl.dot takes no dimension below 16


def scratch_bytes(tokens: int, sequences: int, heads: int, key_dim: int, value_dim: int,
                  operands: str = "tf32") -> int:
    """Bytes of the per-call scratch buffer (formula in the module docstring)."""
    _, dtype, query_dtype = OPERANDS[operands]
    bk, bv = _block(key_dim), _block(value_dim)
    return (tokens // CHUNK + sequences) * heads * ((2 * CHUNK * bk + CHUNK * bv + CHUNK * CHUNK) * dtype.itemsize
                                                    + CHUNK * bk * query_dtype.itemsize + 4 * bk)


def _scratch(tokens, sequences, heads, bk, bv, dtype, query_dtype, device):
    """Views ``(w, kg, qg, uᵀ, A_qkᵀ, e^{G_C})`` of one uint8 allocation (every region a multiple of 16 B)."""
    slots = tokens // CHUNK + sequences
    shapes = [((slots, heads, CHUNK, bk), dtype)] * 2 + [((slots, heads, CHUNK, bk), query_dtype),
                                                        ((slots, heads, bv, CHUNK), dtype),
                                                        ((slots, heads, CHUNK, CHUNK), dtype),
                                                        ((slots, heads, bk), torch.float32)]
    counts = [math.prod(shape) * dt.itemsize for shape, dt in shapes]
    buffer = torch.empty(sum(counts), dtype=torch.uint8, device=device)
    views, offset = [], 0
    for (shape, dt), count in zip(shapes, counts):
        views.append(buffer[offset:offset + count].view(dt).view(shape))
        offset += count
    return views


def _options(operands, key_dim, value_dim, block_v):
    if operands not in OPERANDS:
        raise ValueError(f"triton kda_prefill_chunked: operands expected one of {sorted(OPERANDS)}, got {operands!r}")
    if key_dim > MAX_DIM or value_dim > MAX_DIM:
        raise ValueError(f"triton kda_prefill_chunked: K and V expected <= {MAX_DIM}, got K={key_dim}, V={value_dim}")
    if block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"triton kda_prefill_chunked: block_v expected a power of two >= 16, got {block_v}")


INVERSES = {"ieee": 0, "tf32x3": 1, "bf16x3": 2, "tf32": 3}  # how the inverse's products are formed (_mm_inverse)


def prepare(q, k, v, g, beta, cu_seqlens, sequences, scale, use_qk_l2norm, *, operands="tf32", pair="ieee",
            num_warps=4, inverse="ieee", scan_mma=False, maxnreg=None):
    """Pass A alone: allocates the scratch and fills it; returns its views ``(w, kg, qg, uᵀ, A_qkᵀ, e^{G_C})``.
    (The launcher's first half; separate so that a benchmark can time the passes one by one.)"""
    q, k, v, g, beta = (aligned_rows(t) for t in (q, k, v, kda_gate(g), beta))  # (LAUNCHER_ALIGNED_ARGS)
    heads, key_dim, value_dim, tokens = q.shape[1], q.shape[2], v.shape[2], q.shape[0]
    code, dtype, query_dtype = OPERANDS[operands]
    scratch = _scratch(tokens, sequences, heads, _block(key_dim), _block(value_dim), dtype, query_dtype, q.device)
    kda_chunk_prepare_kernel[(tokens // CHUNK + sequences, heads)](
        q, k, v, g, beta,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1),
        cu_seqlens, *scratch,
        sequences, heads, key_dim, value_dim, float(scale), max(1, sequences.bit_length()),
        BLOCK_K=_block(key_dim), BLOCK_V=_block(value_dim), C=CHUNK, M=MID, GATE_LO=GATE_MIN,
        L2NORM=bool(use_qk_l2norm), OPERAND=code, PAIR=PAIRS[pair], INV=INVERSES[inverse], SCAN=int(bool(scan_mma)),
        num_warps=num_warps, **({"maxnreg": maxnreg} if maxnreg else {}),
    )
    return scratch


def recur(scratch, out, cu_seqlens, state_pool, state_ids, *, operands="tf32", block_v=64, num_warps=4,
          num_stages=2, longest_first=False):
    """Pass B alone: the recurrence over ``scratch`` (from :func:`prepare` with the same ``operands``),
    writing ``out [T, H, V]`` and the pool rows in place. ``longest_first``: the sequences' programs start
    longest first (a device-side argsort of the lengths, no host sync): a call's time is at least its longest
    sequence's chain of steps, which otherwise may start only when earlier programs leave the GPU."""
    heads, key_dim, value_dim = out.shape[1], state_pool.shape[2], out.shape[2]
    scratch_v = _block(value_dim)
    block_v = min(block_v, scratch_v)
    code, dtype, query_dtype = OPERANDS[operands]
    if (scratch[0].dtype, scratch[2].dtype) != (dtype, query_dtype):
        raise ValueError(f"triton kda_prefill_chunked: a scratch of {scratch[0].dtype} / {scratch[2].dtype} (w / qg) "
                         f"is not the {operands!r} mode's {dtype} / {query_dtype}")
    sequences = state_ids.shape[0]
    order = state_ids  # (never read without LONGEST_FIRST)
    longest_first = bool(longest_first) and sequences > 1
    if longest_first:
        order = torch.argsort(cu_seqlens[1:] - cu_seqlens[:-1], descending=True, stable=True).to(torch.int32)
    for first, last in sequence_ranges(sequences, heads):  # one range unless B x H passes axis 1's cap
        kda_chunk_state_kernel[(triton.cdiv(value_dim, block_v), (last - first) * heads)](
            *scratch,
            out, out.stride(0), out.stride(1),
            state_pool, state_pool.stride(0), state_pool.stride(1), state_pool.stride(2),
            state_ids, cu_seqlens, order, heads, key_dim, value_dim, state_pool.shape[0], first,
            BLOCK_K=_block(key_dim), BLOCK_V=block_v, SCRATCH_V=scratch_v, C=CHUNK, OPERAND=code,
            LONGEST_FIRST=longest_first, num_warps=num_warps, num_stages=num_stages,
        )
    return out


def kda_prefill_chunked(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm, *,
                        block_v=64, num_warps=4, num_stages=2, prepare_warps=4, operands="tf32", pair="ieee",
                        inverse="ieee", scan_mma=False, prepare_maxnreg=None, longest_first=False, max_v=MAX_DIM):
    """Chunked prefill of packed sequences: q, k, g ``[T, H, K]``, v ``[T, H, V]``, beta ``[T, H]``,
    ``cu_seqlens [B + 1]``, ``state_pool [P, H, K, V]`` fp32 updated in place at ``state_ids [B]``.
    Returns ``[T, H, V]`` in q's dtype. Two launches, no host sync (see the module docstring).

    ``V > max_v`` (``K`` stays <= :data:`MAX_DIM`): one call per slice of at most ``max_v`` value columns, each on
    its slice of v and, through the view, of the pool. Exact: a state's value columns evolve independently (``u``,
    ``v_new``, ``o`` and the update ``Sᵀ ← Sᵀ ⊙ e^{G_C} + v_newᵀ kg`` are each per column; the gates, keys and queries
    enter every column alike), so each slice is the certified ``V <= 128`` call; pass A's key-side work is repeated
    once a slice.

    ``block_v``: pass B's V slab (a power of two >= 16; capped at V rounded up); ``num_warps`` /
    ``num_stages``: pass B's; ``prepare_warps``: pass A's; ``operands``: ``"tf32"``, ``"mixed"``, ``"bf16"``,
    ``"fp32"`` or ``"fp16"`` (module docstring); ``pair``: ``"ieee"``, ``"tf32x3"`` or ``"bf16x3"``, how those two modes
    form A and A_qk (:func:`_mm_pair`); ``inverse``: ``"ieee"``, ``"tf32x3"``, ``"bf16x3"`` or ``"tf32"``, how the
    inverse's products are formed (:func:`_mm_inverse`); ``scan_mma``: the cumulative gate as one MMA;
    ``prepare_maxnreg``: pass A's register cap (ptxas ``maxnreg``; None: ptxas's choice); ``longest_first``: pass B's
    programs start with the longest sequences' (:func:`recur`)."""
    heads, key_dim, value_dim = q.shape[1], q.shape[2], v.shape[2]
    if not isinstance(max_v, int) or not 1 <= max_v <= MAX_DIM:
        raise ValueError(f"triton kda_prefill_chunked: max_v expected an int in 1..{MAX_DIM}, got {max_v!r}")
    _options(operands, key_dim, min(value_dim, max_v), block_v)
    if pair not in PAIRS:
        raise ValueError(f"triton kda_prefill_chunked: pair expected one of {sorted(PAIRS)}, got {pair!r}")
    if inverse not in INVERSES:
        raise ValueError(f"triton kda_prefill_chunked: inverse expected one of {sorted(INVERSES)}, got {inverse!r}")
    if value_dim > max_v:  # slices of the value columns (exact: see above; each slice's call checks its pool view)
        options = dict(block_v=block_v, num_warps=num_warps, num_stages=num_stages, prepare_warps=prepare_warps,
                       operands=operands, pair=pair, inverse=inverse, scan_mma=scan_mma,
                       prepare_maxnreg=prepare_maxnreg, longest_first=longest_first, max_v=max_v)
        return torch.cat([kda_prefill_chunked(q, k, v[:, :, v0:v0 + max_v], g, beta, cu_seqlens,
                                              state_pool[..., v0:v0 + max_v], state_ids, scale, use_qk_l2norm,
                                              **options)
                          for v0 in range(0, value_dim, max_v)], dim=2)
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    sequences = state_ids.shape[0]
    if out.numel() == 0 or sequences == 0 or key_dim == 0:
        return out.zero_()
    _check_state_pool(state_pool)
    scratch = prepare(q, k, v, g, beta, cu_seqlens, sequences, scale, use_qk_l2norm, operands=operands, pair=pair,
                      num_warps=prepare_warps, inverse=inverse, scan_mma=scan_mma,
                      maxnreg=prepare_maxnreg)
    return recur(scratch, out, cu_seqlens, state_pool, state_ids, operands=operands, block_v=block_v,
                 num_warps=num_warps, num_stages=num_stages, longest_first=longest_first)


# Last: every launched kernel above goes through the launch cache (launcher module docstring).
wrap_launched(globals())
