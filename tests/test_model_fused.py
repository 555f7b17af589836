"""The model's fused elementwise kernels (``core/model/fused.py``) against the torch chains they replace.

Under ``TRITON_INTERPRET=1`` (a child process, ``interpreter_child``) with :func:`dsahal.model.fused.forced_on_host`,
each call site runs once on its torch chain (the CPU path) and once on its kernel, on the same random inputs (never
zeros; norm weights, biases and gates random too), with odd widths and strided inputs (column slices of a wider
projection, as the model passes them). The kernels' outputs come from a NaN-filled ``torch.empty``
(``poisoned_empty``), so an element a kernel fails to write fails every comparison. What is held, as
``core/model/fused.py`` documents it:

* bitwise where the chain is products, sums and casts only: the residual sum, the conv's written states, RoPE's
  rotations and the copies in MLA's query and latent, the RoPE table;
* within one ulp of the output dtype where one reduction or one transcendental function enters before a single
  rounding (the norms, SwiGLU's silu, the gated norm, the conv's output, the indexer's key), two ulp where a
  second rounding follows a first that may flip (``silu(g)`` rounded, then the product), and only a small share
  of elements off at all;
* fp32 results (KDA's gates) within a few fp32 ulp; the indexer's FP8 query within one e4m3 code, its weights
  bitwise unless the query's power-of-two scale moved;
* a whole decode step of the ``tiny`` model (padded as the CUDA-graph runner pads): logits within rounding, the
  same greedy tokens, the same cache rows written, the conv states and the cached latents and index keys bitwise.

The child reports measured numbers; the tests hold the bounds, so a failure prints them. ~30 s on two cores.
"""
from __future__ import annotations

import json

import pytest
import torch

from interpreter_child import child_results, poisoned_empty, run_groups

DTYPES = ("bfloat16", "float16", "float32")
ONE_ULP_SHARE = 0.02  # at most this share of a 16-bit output off by its (at most one or two) ulp
FP32_ULPS = 8  # fp32 results: exp / log1p / sigmoid of numpy vs torch's, a reduction's order: a few ulp
FP32_REL = 1e-6  # normwise, where cancelling sums make ulps meaningless (the indexer's fp32 rotation)


# ------------------------------------------------------------------------------------------------------------
# Child process: the measurements


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(shape, seed, dtype=torch.float32, scale=1.0, shift=0.0):
    """Random, never zero (a zero would hide a skipped product)."""
    x = torch.randn(shape, generator=_gen(seed)) * scale + shift
    return torch.where(x == 0, torch.full_like(x, 0.5), x).to(dtype)


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Bit patterns as integers ordered like the values (so a difference counts ulps); -0 and +0 are one."""
    if x.dtype == torch.float8_e4m3fn:
        bits = x.view(torch.uint8).long()
        return torch.where(bits >= 128, -(bits - 128), bits)
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[x.dtype]
    bits = x.view(view).long()
    sign = 1 << (8 * x.element_size() - 1)
    return torch.where(bits < 0, -(bits + sign), bits)


def _compare(results, key, got, want):
    """max ulp distance, share of elements not bitwise, NaN-free (an unwritten element is NaN), dtype and shape."""
    assert got.dtype == want.dtype and got.shape == want.shape, (key, got.dtype, want.dtype, got.shape, want.shape)
    finite = bool(torch.isfinite(got.float()).all())
    diff = (_ordered(got) - _ordered(want)).abs()
    a, b = got.double(), want.double()
    results[key] = dict(ulps=int(diff.max()) if diff.numel() else 0, off=float((diff > 0).float().mean()),
                        rel=float((a - b).norm() / b.norm().clamp_min(1e-30)), finite=finite,
                        bitwise=bool(torch.equal(got.float(), want.float())) and finite)


def _both(fn):
    """``fn()`` on the torch chain, then forced onto the kernels (their torch.empty NaN-filled)."""
    from dsahal.model import fused

    want = fn()
    with fused.forced_on_host(), poisoned_empty(fused):
        got = fn()
    return got, want


def _strided(rows, width, seed, dtype, extra=7):
    """A ``[rows, width]`` column slice of a wider matrix (the way a packed projection's outputs arrive)."""
    wide = _randn((rows, width + extra), seed, dtype)
    return wide[:, 3:3 + width]


def _norm_cases(results):
    from dsahal.model.layers import RMSNorm

    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for width in (37, 256):
            norm = RMSNorm(width, 1e-6)
            norm.weight.data = _randn((width,), 1, dtype, 0.3, 1.0)
            x = _strided(5, width, 2, dtype)
            residual = _randn((5, width), 3, dtype)
            with torch.no_grad():
                got, want = _both(lambda: norm(x))
                _compare(results, f"rms_norm_{dtype_name}_{width}", got, want)
                (got, got_sum), (want, want_sum) = _both(lambda: norm(x, residual))
                _compare(results, f"rms_norm_residual_{dtype_name}_{width}", got, want)
                _compare(results, f"rms_norm_residual_sum_{dtype_name}_{width}", got_sum, want_sum)


def _gated_norm_cases(results):
    from dsahal.model.layers import GatedRMSNorm

    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        for width in (24, 33):
            norm = GatedRMSNorm(width, 1e-6)
            norm.weight.data = _randn((width,), 4, dtype, 0.3, 1.0)
            o = _randn((5, 3, width + 5), 5, dtype)[..., 2:2 + width]  # strided heads
            gate = _randn((5, 3 * width + 9), 6, dtype, 2.0)[:, 4:4 + 3 * width].view(5, 3, width)
            with torch.no_grad():
                got, want = _both(lambda: norm(o, gate))
            _compare(results, f"gated_norm_{dtype_name}_{width}", got, want)


def _swiglu_cases(results):
    from dsahal.model.layers import swiglu_act

    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        packed = _randn((6, 2 * 45), 7, dtype, 3.0)  # [T, 2I]: gate then up, as one packed projection
        gate, up = packed.split(45, dim=-1)
        got, want = _both(lambda: swiglu_act(gate, up))
        _compare(results, f"swiglu_{dtype_name}", got, want)
    experts = _randn((3, 4, 2 * 20), 8, torch.bfloat16, 3.0)  # MoE's batched experts: [e, T, 2I] chunks
    gate, up = experts.chunk(2, dim=-1)
    got, want = _both(lambda: swiglu_act(gate, up))
    _compare(results, "swiglu_batched_experts_bfloat16", got, want)


def _tiny_layers(dtype, **changes):
    import dataclasses

    from dsahal.config import load_config
    from dsahal.model.model import HybridModel

    config = dataclasses.replace(load_config("tiny"), **changes)
    model = HybridModel(config)
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            p.copy_(_randn(p.shape, 100 + i, torch.float32, p.shape[-1] ** -0.5 if p.dim() > 1 else 0.3,
                           0.0 if p.dim() > 1 or "bias" in name or "A_log" in name else 1.0))
    return config, model.to(dtype)


def _kda_cases(results):
    from dsahal.model import fused
    from dsahal.model.batch import BatchMeta

    for dtype_name in ("bfloat16", "float32"):
        dtype = getattr(torch, dtype_name)
        config, model = _tiny_layers(dtype)
        layer = model.blocks[0].attn
        heads, dim = layer.heads, layer.head_dim
        tokens = 6
        x = _randn((tokens, config.hidden_size), 9, dtype)
        decay_low = _strided(tokens, config.kda_gate_rank, 10, dtype)
        beta_raw = _strided(tokens, heads, 11, dtype, extra=5)
        # decay_up's output spans softplus's regimes: far below 0, around 0, past the threshold (20)
        layer.decay_up.weight.data = _randn(layer.decay_up.weight.shape, 12, dtype, 4.0)
        layer.dt_bias.data = _randn((heads * dim,), 13, dtype, 8.0)
        with torch.no_grad():
            (g, beta), (g_want, beta_want) = _both(lambda: layer.gates(x, decay_low, beta_raw))
        _compare(results, f"kda_log_decay_{dtype_name}", g, g_want)
        _compare(results, f"kda_beta_{dtype_name}", beta, beta_want)
        raw = (layer.decay_up(decay_low).float() + layer.dt_bias.float()).detach()
        results[f"kda_gates_regimes_{dtype_name}"] = bool((raw < -15).any() and (raw > 20).any()
                                                          and ((raw > -2) & (raw < 2)).any())
        # the short conv, one token per request: ids with a padding request and rows left idle
        width = layer.conv_kernel - 1
        channels = heads * dim
        ids = torch.tensor([3, -1, 0, 5], dtype=torch.int32)
        slots = 7
        qkv = _randn((4, 3 * channels + 8), 14, dtype)[:, 8:].view(4, 3, channels)
        buffer = _randn((slots, 3 * width * channels + 11), 15)  # slot stride wider than the states: a view
        start = buffer.clone()
        meta = BatchMeta(torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32),
                         torch.zeros((4, 1), dtype=torch.int32), torch.zeros(4, dtype=torch.long),
                         torch.arange(5, dtype=torch.int32), ids, 1, True)

        def conv():
            pool = buffer[:, 11:].view(slots, 3, width, channels)
            return layer.short_conv(qkv, meta, pool), buffer.clone()

        with torch.no_grad():
            buffer.copy_(start)
            want, want_pool = conv()
            buffer.copy_(start)
            with fused.forced_on_host(), poisoned_empty(fused):
                got, got_pool = conv()
        _compare(results, f"conv_out_{dtype_name}", got, want)
        _compare(results, f"conv_pool_{dtype_name}", got_pool, want_pool)
        untouched = torch.ones(slots, dtype=torch.bool)
        untouched[[3, 0, 5]] = False
        results[f"conv_idle_rows_{dtype_name}"] = bool(torch.equal(got_pool[untouched], start[untouched])
                                                       and torch.equal(got_pool[:, :11], start[:, :11]))
        results[f"conv_wrote_{dtype_name}"] = bool((got_pool != start).any())


def _rope_table_cases(results):
    from dsahal.model.rope import Rope

    positions = torch.tensor([0, 1, 7, 4095, 160_000, 33], dtype=torch.int32)
    for dim in (64, 36):
        rope = Rope(dim, 10000.0)
        (cos, sin), (cos_want, sin_want) = _both(lambda: rope.cos_sin(positions))
        _compare(results, f"rope_cos_{dim}", cos, cos_want)
        _compare(results, f"rope_sin_{dim}", sin, sin_want)


def _mla_cases(results):
    from dsahal.model.batch import BatchMeta

    for layout in ("interleaved", "rotate_half"):
        for dtype_name in ("bfloat16", "float32"):
            dtype = getattr(torch, dtype_name)
            config, model = _tiny_layers(dtype, rope_layout=layout, index_rope_layout=layout)
            layer = model.blocks[3].attn
            tokens, heads = 5, layer.heads
            positions = torch.tensor([3, 300, 41, 0, 77], dtype=torch.int32)
            meta = BatchMeta(positions, torch.arange(tokens, dtype=torch.int32), torch.zeros((tokens, 1),
                             dtype=torch.int32), torch.zeros(tokens, dtype=torch.long),
                             torch.arange(tokens + 1, dtype=torch.int32), torch.zeros(tokens, dtype=torch.int32),
                             512, True)
            cos, sin = layer.cos_sin(layer.rope, meta)
            q = _randn((tokens, heads, layer.nope_dim + layer.rope_dim + 4), 20, dtype)[..., :-4]
            q_nope, q_rope = q.split([layer.nope_dim, layer.rope_dim], dim=-1)
            kv = _strided(tokens, layer.latent_rank + layer.rope_dim, 21, dtype)
            c_kv, k_rope = kv.split([layer.latent_rank, layer.rope_dim], dim=-1)
            nope_absorbed = torch.einsum("thd,hdr->thr", q_nope, layer.absorbed_weights()[0]).detach()
            with torch.no_grad():
                (q_abs, latent), (q_want, latent_want) = _both(
                    lambda: layer.query_latent(nope_absorbed, q_rope, c_kv, k_rope, cos, sin))
            rank = layer.latent_rank
            key = f"{layout}_{dtype_name}"
            _compare(results, f"mla_query_{key}", q_abs, q_want)
            _compare(results, f"mla_latent_norm_{key}", latent[:, :rank], latent_want[:, :rank])
            _compare(results, f"mla_latent_rope_{key}", latent[:, rank:], latent_want[:, rank:])
            for fp8, fmt in ((True, "ue8m0"), (True, "fp32"), (False, "ue8m0")):
                layer.index_query_fp8, layer.index_scale_fmt = fp8, fmt
                c_q = _randn((tokens, config.q_lora_rank), 22, dtype)
                index_k = _strided(tokens, layer.index_dim, 23, dtype, extra=9)
                index_w = _strided(tokens, layer.index_heads, 24, dtype, extra=3)
                layer.index_k_norm.bias.data = _randn((layer.index_dim,), 25, dtype, 0.2)
                with torch.no_grad():
                    (q_index, k_index, weights), want = _both(
                        lambda: layer.fused_indexer_inputs(c_q, index_k, index_w, meta))
                case = f"{key}_{'fp8_' + fmt if fp8 else 'nofp8'}"
                _compare(results, f"indexer_query_{case}", q_index, want[0])
                _compare(results, f"indexer_key_{case}", k_index, want[1])
                _compare(results, f"indexer_weights_{case}", weights, want[2])


def _step_cases(results):
    """The whole decode step of ``tiny``, padded to 8 rows as the CUDA-graph runner pads, both ways."""
    from dsahal.bench.measure import relative_error
    from dsahal.bench.model_step import CHECK_CONTEXTS, decode_setup
    from dsahal.config import load_config
    from dsahal.engine.cuda_graph import pad_decode_inputs
    from dsahal.model import fused
    from dsahal.registry import use_backend

    config = load_config("tiny")
    setup = decode_setup(config, CHECK_CONTEXTS, "cpu", dtype=torch.bfloat16, check=True)
    rows = len(CHECK_CONTEXTS)
    table = torch.cat([setup.block_table, torch.full_like(setup.block_table[:1], -1)])
    batch = pad_decode_inputs(setup.inputs, 8, padding_row=rows)
    pool = setup.cache.pool
    before = pool.clone()

    def step():
        return setup.model.step(batch.token_ids, batch.positions, batch.req_ids, table, batch.slots,
                                batch.cu_seqlens, batch.state_ids, setup.views, max_context=setup.max_context,
                                decode=True)

    with use_backend("reference"), torch.no_grad():
        want = step()
        want_pool = pool.clone()
        pool.copy_(before)
        with fused.forced_on_host():
            got = step()
        got_pool = pool.clone()
    ids = setup.inputs.state_ids.long()
    conv_equal = all(torch.equal(setup.cache.kda_conv_states(layer)[ids], _view_conv(setup, want_pool, layer, ids))
                     for layer in config.kda_layers)
    slots = setup.inputs.slots.long()
    written = all(torch.equal(_pages(setup, got_pool, layer, slots), _pages(setup, want_pool, layer, slots))
                  for layer in config.dsa_layers)
    results["step"] = dict(
        err=relative_error(got[:rows], want[:rows]), tokens=bool(torch.equal(got[:rows].argmax(-1),
                                                                               want[:rows].argmax(-1))),
        rows=bool(torch.equal((got_pool != before).any(dim=-1), (want_pool != before).any(dim=-1))),
        wrote=bool((got_pool != before).any()), conv=conv_equal, pages=written,
        finite=bool(torch.isfinite(got).all()))


def _view_conv(setup, pool_copy, layer, ids):
    saved = setup.cache.pool.clone()
    setup.cache.pool.copy_(pool_copy)
    out = setup.cache.kda_conv_states(layer)[ids].clone()
    setup.cache.pool.copy_(saved)
    return out


def _pages(setup, pool_copy, layer, slots):
    saved = setup.cache.pool.clone()
    setup.cache.pool.copy_(pool_copy)
    lat, idx = setup.cache.latent_pages(layer), setup.cache.index_pages(layer)
    out = torch.cat([lat.flatten(0, 1)[slots], idx.flatten(0, 1)[slots]], dim=-1).clone()
    setup.cache.pool.copy_(saved)
    return out


def _active_cases(results):
    """When a call site takes the kernels: forced CPU tensors yes; float64, autograd, tracing, disabled() no."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dsahal.model import fused

    x = torch.randn(3, 4)
    w = torch.nn.Parameter(torch.randn(4))

    class Tracer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with fused.forced_on_host():
        results["active_forced"] = fused.active(x)
        results["active_float64"] = fused.active(x.double())
        results["active_grad"] = fused.active(x, w)
        with torch.no_grad():
            results["active_no_grad"] = fused.active(x, w)
        with Tracer():
            results["active_tracing"] = fused.active(x)
        with fused.disabled():
            results["active_disabled"] = fused.active(x)
    results["active_unforced"] = fused.active(x)


def _run_all() -> dict:
    return run_groups((_norm_cases, _gated_norm_cases, _swiglu_cases, _kda_cases, _rope_table_cases, _mla_cases,
                       _step_cases, _active_cases), normalise=False)


# ------------------------------------------------------------------------------------------------------------
# Tests (parent process)


@pytest.fixture(scope="module")
def measured():
    return child_results(__file__)


def _within(measured, key, ulps, share=ONE_ULP_SHARE):
    entry = measured[key]
    assert entry["finite"], f"{key}: a NaN or inf in the kernel's output (an unwritten element?)"
    assert entry["ulps"] <= ulps, f"{key}: {entry['ulps']} ulp from the torch chain (bound {ulps}): {entry}"
    assert entry["off"] <= share, f"{key}: {entry['off']:.1%} of the elements not bitwise (bound {share:.0%})"


def _bitwise(measured, key):
    entry = measured[key]
    assert entry["bitwise"], f"{key}: expected bitwise equal to the torch chain, got {entry}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [37, 256])
def test_rms_norm_and_the_residual_add_match_the_torch_chain(measured, dtype, width):
    fp32 = dtype == "float32"
    _within(measured, f"rms_norm_{dtype}_{width}", FP32_ULPS if fp32 else 1, 1.0 if fp32 else ONE_ULP_SHARE)
    _within(measured, f"rms_norm_residual_{dtype}_{width}", FP32_ULPS if fp32 else 1, 1.0 if fp32 else ONE_ULP_SHARE)
    _bitwise(measured, f"rms_norm_residual_sum_{dtype}_{width}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [24, 33])
def test_the_gated_norm_matches_the_torch_chain(measured, dtype, width):
    # a 16-bit o: the norm rounded, then the gate's product rounded (a flipped first rounding: two ulp)
    fp32 = dtype == "float32"
    _within(measured, f"gated_norm_{dtype}_{width}", FP32_ULPS if fp32 else 2, 1.0 if fp32 else ONE_ULP_SHARE)


@pytest.mark.parametrize("key", [f"swiglu_{d}" for d in DTYPES] + ["swiglu_batched_experts_bfloat16"])
def test_swiglu_matches_the_torch_chain(measured, key):
    fp32 = key.endswith("float32")
    _within(measured, key, FP32_ULPS if fp32 else 2, 1.0 if fp32 else ONE_ULP_SHARE)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_kda_gates_match_the_torch_chain_in_every_softplus_regime(measured, dtype):
    assert measured[f"kda_gates_regimes_{dtype}"], "the inputs missed a softplus regime (the test is too weak)"
    _within(measured, f"kda_log_decay_{dtype}", FP32_ULPS, 1.0)
    _within(measured, f"kda_beta_{dtype}", FP32_ULPS, 1.0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_conv_decode_kernel_writes_the_states_bitwise_and_leaves_other_rows(measured, dtype):
    fp32 = dtype == "float32"
    _within(measured, f"conv_out_{dtype}", FP32_ULPS if fp32 else 1, 1.0 if fp32 else ONE_ULP_SHARE)
    _bitwise(measured, f"conv_pool_{dtype}")
    assert measured[f"conv_wrote_{dtype}"], "the conv wrote no state (the comparison would be vacuous)"
    assert measured[f"conv_idle_rows_{dtype}"], "a padding / idle row or a byte beside the states changed"


@pytest.mark.parametrize("key", ["rope_cos_64", "rope_sin_64", "rope_cos_36", "rope_sin_36"])
def test_the_rope_table_matches_the_float64_torch_chain(measured, key):
    _within(measured, key, 1, 1.0)  # fp64 cos / sin of numpy vs torch, then rounded to fp32: at most one ulp


@pytest.mark.parametrize("layout", ["interleaved", "rotate_half"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_mla_query_and_latent_match_the_torch_chain(measured, layout, dtype):
    key = f"{layout}_{dtype}"
    _bitwise(measured, f"mla_query_{key}")  # the absorbed nope copied, RoPE's products and sums, one rounding
    _bitwise(measured, f"mla_latent_rope_{key}")
    fp32 = dtype == "float32"
    _within(measured, f"mla_latent_norm_{key}", FP32_ULPS if fp32 else 1, 1.0 if fp32 else ONE_ULP_SHARE)


@pytest.mark.parametrize("layout", ["interleaved", "rotate_half"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("variant", ["fp8_ue8m0", "fp8_fp32", "nofp8"])
def test_the_indexer_inputs_match_the_torch_chain(measured, layout, dtype, variant):
    case = f"{layout}_{dtype}_{variant}"
    if dtype == "float32":
        # nothing rounds to hide the LayerNorm's fp32 moments: the rotation's sums carry them, and an output near
        # zero (a cancelling sum) is many ulp off for a tiny absolute difference; normwise within fp32 rounding
        for part in ("key", "query") if variant == "nofp8" else ("key",):
            entry = measured[f"indexer_{part}_{case}"]
            assert entry["finite"] and entry["rel"] < FP32_REL, f"indexer_{part}_{case}: {entry}"
    else:
        # LayerNorm rounded, RoPE rounded, the rotation's sums rounded (an early flip moves a sum by a part in 2^8 of
        # one term of 128): within two ulp
        _within(measured, f"indexer_key_{case}", 2, 0.1)
        if variant == "nofp8":
            _within(measured, f"indexer_query_{case}", 2, 0.1)
    if variant == "nofp8":
        _bitwise(measured, f"indexer_weights_{case}")
    else:
        _within(measured, f"indexer_query_{case}", 1, 0.1)  # e4m3 codes
        if variant == "fp8_fp32":  # the scale amax / 448 carries amax's rounding (the rotation's sums): fp32 ulps
            _within(measured, f"indexer_weights_{case}", FP32_ULPS, 1.0)
        else:  # a power-of-two scale: bitwise unless amax crossed a power of two
            weights = measured[f"indexer_weights_{case}"]
            assert weights["finite"] and weights["off"] <= 0.1, f"indexer_weights_{case}: {weights}"


def test_a_whole_decode_step_matches_the_torch_chains(measured):
    entry = measured["step"]
    assert entry["finite"] and entry["wrote"], entry
    assert entry["err"] < 1e-2, f"logits rel err {entry['err']:.2e} (bf16 step; tol 1e-2)"
    assert entry["tokens"], "greedy tokens differ"
    assert entry["rows"], "the fused step wrote other cache rows (padding rows must write nothing)"
    assert entry["conv"], "the conv states differ (they are copies: expected bitwise)"
    assert entry["pages"], "the cached latents / index keys differ"


def test_when_a_call_site_takes_the_kernels(measured):
    assert measured["active_forced"] and measured["active_no_grad"]
    assert not measured["active_unforced"], "CPU tensors took the kernels outside forced_on_host"
    assert not measured["active_float64"], "a float64 chain took the kernels (they compute in fp32)"
    assert not measured["active_grad"], "a chain through a parameter that requires grad took the kernels"
    assert not measured["active_tracing"], "a traced chain took the kernels"
    assert not measured["active_disabled"], "disabled() did not turn the kernels off"


def test_forcing_the_kernels_on_the_host_needs_the_interpreter():
    """In this process TRITON_INTERPRET is not set (or Triton is absent): forcing is refused, naming it."""
    import os

    from dsahal.model import fused

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process runs under the interpreter")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        with fused.forced_on_host():
            pass
    assert not fused.active(torch.randn(2))


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
