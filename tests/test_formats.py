"""Cache formats: sizes, round-trip bounds at the extremes, exact re-packing, rounding rules, byte layouts."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal.formats import INDEX_FORMATS, LATENT_FORMATS, index_format, latent_format
from dsahal.formats.numerics import e2m1_encode, e4m3_round_up, pack_nibbles, pow2_scale_at_least

ALL = [f for f in LATENT_FORMATS.values()] + [f for f in INDEX_FORMATS.values()]
IDS = [str(f) for f in ALL]
FAST = settings(max_examples=15, deadline=None)


def tensor_scale(fmt, values=None):
    """The per-tensor scale a caller would calibrate for ``values`` (448 at the largest magnitude)."""
    if not fmt.needs_tensor_scale:
        return None
    amax = 1.0 if values is None else max(float(values.abs().max()), 1e-30)
    return torch.tensor(amax / 448.0)


def assert_within_bound(fmt, values, scale=None):
    out = fmt.unpack(fmt.pack(values, scale), scale)
    bound = fmt.error_bound(values, scale)
    err = (out - values.float()).abs()
    worst = int(torch.argmax(err - bound))
    assert bool((err <= bound).all()), (
        f"{fmt}: |error| {float(err.flatten()[worst]):.3g} > bound {float(bound.flatten()[worst]):.3g} "
        f"at value {float(values.flatten()[worst]):.6g}")
    return out


def test_bytes_per_token_are_the_documented_sizes():
    sizes = {str(f): f.token_bytes for f in ALL}
    assert sizes == {"latent:bf16": 1152, "latent:fp8": 576, "latent:fp8_ds_mla": 656, "latent:nvfp4": 352,
                     "index:bf16": 256, "index:fp8": 132, "index:mxfp4": 68}


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_pack_produces_one_record_of_token_bytes_per_token(fmt):
    values = torch.randn(5, fmt.dim)
    records = fmt.pack(values, tensor_scale(fmt, values))
    assert records.dtype == torch.uint8 and records.shape == (5, fmt.token_bytes)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_an_empty_batch_packs_and_unpacks_to_empty(fmt):
    scale = tensor_scale(fmt)
    records = fmt.pack(torch.zeros(0, fmt.dim), scale)
    assert records.shape == (0, fmt.token_bytes)
    assert fmt.unpack(records, scale).shape == (0, fmt.dim)
    assert fmt.error_bound(torch.zeros(0, fmt.dim), scale).shape == (0, fmt.dim)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_meta_tensors_give_the_shapes_without_values(fmt):
    """Shape inference (fake tensors, ``torch.device("meta")``): pack / unpack / error_bound return empty meta
    tensors of the contract's shapes and dtypes; shapes and dtypes are still checked; a scale must be on the
    meta device exactly when the data is."""
    scale = None if tensor_scale(fmt) is None else tensor_scale(fmt).to("meta")
    values = torch.empty(7, fmt.dim, device="meta", dtype=torch.bfloat16)
    records = fmt.pack(values, scale)
    assert (records.device.type, records.dtype, tuple(records.shape)) == ("meta", torch.uint8, (7, fmt.token_bytes))
    out = fmt.unpack(records, scale)
    assert (out.device.type, out.dtype, tuple(out.shape)) == ("meta", torch.float32, (7, fmt.dim))
    bound = fmt.error_bound(values, scale)
    assert (bound.device.type, bound.dtype, tuple(bound.shape)) == ("meta", torch.float32, (7, fmt.dim))
    with pytest.raises(ValueError, match=rf"{fmt.kind}:{fmt.name}\.pack: argument 'values' expected shape"):
        fmt.pack(torch.empty(7, fmt.dim + 1, device="meta"), scale)
    with pytest.raises(TypeError, match="argument 'records' expected dtype uint8"):
        fmt.unpack(torch.empty(7, fmt.token_bytes, device="meta", dtype=torch.int32), scale)
    if scale is not None:
        with pytest.raises(ValueError, match="argument 'scale' expected on the meta device exactly when"):
            fmt.pack(torch.randn(2, fmt.dim), scale)
        with pytest.raises(ValueError, match="argument 'scale' expected on the meta device exactly when"):
            fmt.pack(values, tensor_scale(fmt))


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
@FAST
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-30, 30), spread=st.floats(0, 12))
def test_round_trip_is_within_the_documented_bound(fmt, seed, log_scale, spread):
    gen = torch.Generator().manual_seed(seed)
    # magnitudes spanning 2^(log_scale ± spread) within one token: blocks with tiny and large values
    magnitude = torch.exp2(log_scale + spread * (2 * torch.rand(6, fmt.dim, generator=gen) - 1))
    values = magnitude * torch.randn(6, fmt.dim, generator=gen).sign()
    assert_within_bound(fmt, values, tensor_scale(fmt, values))


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
@FAST
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-20, 20))
def test_repacking_an_unpacked_record_is_exact(fmt, seed, log_scale):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(4, fmt.dim, generator=gen) * 2.0**log_scale
    scale = tensor_scale(fmt, values)
    once = fmt.unpack(fmt.pack(values, scale), scale)
    twice = fmt.unpack(fmt.pack(once, scale), scale)
    assert torch.equal(once, twice)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_values_at_the_largest_storable_magnitude_are_within_bound(fmt):
    scale = tensor_scale(fmt)
    limit = fmt.max_abs(scale)
    near = torch.stack([limit, -limit, limit * 0.999, -limit * (1 - 2.0**-20), limit * 0.5])
    assert_within_bound(fmt, near, scale)


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_values_beyond_the_largest_magnitude_saturate_within_bound(fmt):
    scale = tensor_scale(fmt)
    limit = fmt.max_abs(scale)
    beyond = torch.clamp(limit * 4, max=torch.finfo(torch.float32).max)
    values = torch.stack([beyond, -beyond])
    out = assert_within_bound(fmt, values, scale)
    assert bool(torch.isfinite(out).all()), f"{fmt}: saturation produced Inf/NaN"
    saturating = beyond > limit
    assert bool((out[0][saturating] <= limit[saturating]).all())


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
@pytest.mark.parametrize("magnitude", [1e-3, 1e-12, 1e-30, 1e-40, 1.4e-45], ids=lambda m: f"{m:g}")
def test_tiny_values_are_within_bound(fmt, magnitude):
    values = torch.full((2, fmt.dim), magnitude)
    values[1, ::2] = -magnitude
    assert_within_bound(fmt, values, tensor_scale(fmt))


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_zeros_round_trip_exactly_and_negative_zero_keeps_its_sign(fmt):
    values = torch.zeros(2, fmt.dim)
    values[1] = -0.0
    out = fmt.unpack(fmt.pack(values, tensor_scale(fmt)), tensor_scale(fmt))
    assert torch.equal(out, values)
    assert bool(torch.signbit(out[1]).all()) and not bool(torch.signbit(out[0]).any())


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_input_is_rejected_naming_the_format(fmt, bad):
    values = torch.randn(3, fmt.dim)
    values[1, 7] = bad
    with pytest.raises(ValueError, match=rf"{fmt.kind}:{fmt.name}\.pack: argument 'values' expected finite"):
        fmt.pack(values, tensor_scale(fmt))


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_malformed_arguments_raise_naming_the_argument(fmt):
    scale = tensor_scale(fmt)
    with pytest.raises(ValueError, match=rf"argument 'values' expected shape \[N, {fmt.dim}\]"):
        fmt.pack(torch.randn(2, fmt.dim + 1), scale)
    with pytest.raises(TypeError, match="argument 'values' expected a float32"):
        fmt.pack(torch.zeros(2, fmt.dim, dtype=torch.int32), scale)
    with pytest.raises(ValueError, match=rf"argument 'records' expected shape \[N, {fmt.token_bytes}\]"):
        fmt.unpack(torch.zeros(2, fmt.token_bytes - 1, dtype=torch.uint8), scale)
    with pytest.raises(TypeError, match="argument 'records' expected dtype uint8"):
        fmt.unpack(torch.zeros(2, fmt.token_bytes), scale)
    if fmt.needs_tensor_scale:
        with pytest.raises(TypeError, match="argument 'scale'"):
            fmt.pack(torch.randn(2, fmt.dim), None)
        with pytest.raises(ValueError, match="argument 'scale' expected a finite value > 0"):
            fmt.pack(torch.randn(2, fmt.dim), torch.tensor(0.0))
    else:
        with pytest.raises(ValueError, match="argument 'scale' expected None"):
            fmt.pack(torch.randn(2, fmt.dim), torch.tensor(1.0))


# -- rounding rules ------------------------------------------------------------------------------

def test_e2m1_rounds_to_nearest_with_ties_to_even():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0])
    expected_magnitude_codes = [0, 2, 2, 4, 4, 6, 6, 0, 6]  # 0, 1.0, 1.0, 2, 2, 4, 4, -0, -4
    codes = e2m1_encode(ties)
    assert [int(c) & 7 for c in codes] == expected_magnitude_codes
    assert [int(c) >> 3 for c in codes] == [0] * 7 + [1, 1]
    near = torch.tensor([0.26, 0.74, 5.01, 7.0, 100.0])
    assert [int(c) for c in e2m1_encode(near)] == [1, 1, 7, 7, 7]  # 0.5, 0.5, 6, 6 (saturated), 6


def test_nibble_order_puts_even_elements_in_the_low_nibble():
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x8]], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [[0x21, 0x8F]]


@given(amax=st.floats(0, 3.0000000054977558e+38, width=32), qmax=st.sampled_from([6.0, 448.0]))
@settings(max_examples=200, deadline=None)
def test_power_of_two_scales_are_the_smallest_that_do_not_saturate(amax, qmax):
    scale = float(pow2_scale_at_least(torch.tensor([amax]), qmax, -127, 127))
    assert math.frexp(scale)[0] == 0.5  # a power of two
    assert amax <= qmax * scale
    if scale > 2.0**-127:
        assert amax > qmax * scale / 2  # half of it would saturate


@given(value=st.floats(0, 448, width=32))
@settings(max_examples=200, deadline=None)
def test_e4m3_round_up_gives_the_smallest_e4m3_not_below_the_value(value):
    up = float(e4m3_round_up(torch.tensor([value])).float())
    assert up >= value
    below = torch.tensor([up]).to(torch.float8_e4m3fn).view(torch.uint8) - 1
    if up > 0:
        assert float(below.view(torch.float8_e4m3fn).float()) < value


@pytest.mark.parametrize("name,block", [("nvfp4", 16), ("mxfp4", 32), ("fp8_ds_mla", 128)])
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-10, 10))
@FAST
def test_block_maximum_never_saturates(name, block, seed, log_scale):
    fmt = index_format(name) if name == "mxfp4" else latent_format(name)
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(8, fmt.dim, generator=gen) * 2.0**log_scale
    if name == "nvfp4":  # one-level NVFP4 holds block maxima up to 6 * 448 by design; stay inside
        values = values.clamp(-2688.0, 2688.0)
    quantised_dims = {"nvfp4": 512, "mxfp4": 128, "fp8_ds_mla": 512}[name]
    scales = {"nvfp4": lambda v: fmt.block_scales(v), "mxfp4": lambda v: fmt.block_scales(v),
              "fp8_ds_mla": lambda v: fmt.tile_scales(v)}[name](values)
    qmax = 448.0 if name == "fp8_ds_mla" else 6.0
    amax = values[:, :quantised_dims].abs().reshape(8, -1, block).amax(-1)
    assert bool((amax <= qmax * scales).all())
    # so the largest element of each block is only rounded (its bound has no saturation term)
    out = fmt.unpack(fmt.pack(values))
    index = values[:, :quantised_dims].abs().reshape(8, -1, block).argmax(-1, keepdim=True)
    pick = lambda t: t[:, :quantised_dims].reshape(8, -1, block).gather(-1, index)  # noqa: E731
    assert bool(((pick(out) - pick(values)).abs() <= pick(fmt.error_bound(values))).all())


# -- byte layouts --------------------------------------------------------------------------------

def test_ds_mla_record_is_e4m3_then_fp32_tile_scales_then_bf16_rope():
    fmt = latent_format("fp8_ds_mla")
    values = torch.randn(1, 576)
    values[0, 128:256] *= 1000.0
    record = fmt.pack(values)[0]
    scales = record[512:528].view(torch.float32)
    assert scales.tolist() == fmt.tile_scales(values)[0].tolist() and scales[1] > 100 * scales[0]
    expected_nope = (values[0, :128] / scales[0]).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(record[:128], expected_nope)
    assert torch.equal(record[528:656].view(torch.bfloat16), values[0, 512:].to(torch.bfloat16))


def test_nvfp4_record_is_packed_e2m1_then_e4m3_rope_then_e4m3_block_scales():
    fmt = latent_format("nvfp4")
    values = torch.zeros(1, 576)
    values[0, 0], values[0, 1] = 6.0, -0.5  # block 0: amax 6 -> scale 1.0
    values[0, 16:32] = 12.0  # block 1: amax 12 -> scale 2.0, codes 6
    values[0, 512:] = torch.linspace(-3, 3, 64)
    record = fmt.pack(values)[0]
    assert int(record[0]) == (0x7 | (0x9 << 4))  # dim 0 = +6 (code 7) low nibble, dim 1 = -0.5 (code 9) high
    assert int(record[8]) == 0x77  # dims 16, 17: +6 at scale 2
    assert torch.equal(record[256:320], values[0, 512:].to(torch.float8_e4m3fn).view(torch.uint8))
    block_scales = record[320:352].view(torch.float8_e4m3fn).float()
    assert block_scales[:2].tolist() == [1.0, 2.0]
    assert block_scales[2:].tolist() == [2.0**-6] * 30  # all-zero blocks take the floor


def test_mxfp4_record_is_packed_e2m1_then_ue8m0_scales():
    fmt = index_format("mxfp4")
    values = torch.zeros(1, 128)
    values[0, 0] = 6.0  # block 0: amax 6 -> 2^0 -> byte 127
    values[0, 32] = 3.0 * 2.0**-20  # block 1: amax 3·2^-20 -> 2^-21 (3/6 rounds up to 2^-1)
    record = fmt.pack(values)[0]
    assert record[64:68].tolist() == [127, 127 - 21, 0, 0]  # empty blocks take 2^-127 (byte 0)
    assert int(record[0]) == 0x07 and int(record[16]) == 0x07  # 6 / 1 and 3·2^-20 / 2^-21 = 6
