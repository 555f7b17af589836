"""The XLA codecs pack and unpack every claimed cache format bit for bit like the host formats."""
from __future__ import annotations

import pytest
import torch

from dsahal.backends.tpu import bits, formats, numerics
from dsahal.backends.tpu.support import INDEX_FORMATS, LATENT_FORMATS
from dsahal.formats import cache_format

CLAIMED = [("latent", f) for f in sorted(LATENT_FORMATS)] + [("index", f) for f in sorted(INDEX_FORMATS)]


def values_with_extremes(dim: int, scale: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(dim)
    values = torch.randn(16, dim, generator=gen) * torch.logspace(-6, 3, 16)[:, None]
    values[0] = 0.0
    values[1, ::2] = -0.0
    values[2] = 448.0 * scale * torch.linspace(-1.5, 1.5, dim)  # beyond the FP8 range: saturates
    values[3] = 2.0**-12 * scale  # FP8 subnormals
    return values


@pytest.mark.parametrize("kind,fmt", CLAIMED, ids=[f"{k}:{f}" for k, f in CLAIMED])
def test_pack_is_bit_identical_to_the_host_format(kind, fmt, xla):
    spec = cache_format(kind, fmt)
    scale = torch.tensor(0.03) if spec.needs_tensor_scale else None
    values = values_with_extremes(spec.dim, 0.03 if scale is not None else 1.0)
    expected = spec.pack(values, scale)
    got = formats.pack(values.to(xla), kind, fmt, None if scale is None else scale.to(xla)).cpu()
    assert torch.equal(got, expected), f"{kind}:{fmt}: {(got != expected).sum()} bytes differ"


@pytest.mark.parametrize("kind,fmt", CLAIMED, ids=[f"{k}:{f}" for k, f in CLAIMED])
def test_unpack_is_bit_identical_to_the_host_format(kind, fmt, xla):
    spec = cache_format(kind, fmt)
    scale = torch.tensor(0.03) if spec.needs_tensor_scale else None
    records = spec.pack(values_with_extremes(spec.dim, 1.0), scale).reshape(4, 4, spec.token_bytes)
    expected = spec.unpack(records.reshape(-1, spec.token_bytes), scale).reshape(4, 4, spec.dim)
    got = formats.unpack(records.to(xla), kind, fmt, None if scale is None else scale.to(xla)).cpu()
    assert torch.equal(got, expected)


def test_an_mxfp4_nan_scale_byte_decodes_its_block_to_nan_as_the_host_format(xla):
    """Scale byte 255 is the OCP MX NaN scale (no encoder writes it): its 32-dim block decodes to NaN, the others
    as before, the same as the host format."""
    spec = cache_format("index", "mxfp4")
    records = spec.pack(values_with_extremes(spec.dim, 1.0)).reshape(4, 4, spec.token_bytes)
    records[1, 2, 64 + 3] = 255  # key (1, 2)'s last block
    expected = spec.unpack(records.reshape(-1, spec.token_bytes)).reshape(4, 4, spec.dim)
    got = formats.unpack(records.to(xla), "index", "mxfp4", None).cpu()
    assert bool(torch.isnan(expected[1, 2, 96:]).all()) and bool(torch.isfinite(expected[1, 2, :96]).all())
    assert torch.equal(torch.isnan(got), torch.isnan(expected))
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected))


def test_every_fp8_code_decodes_exactly(xla):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    expected = codes.view(torch.float8_e4m3fn).float()
    got = bits.fp8_e4m3_decode(codes.to(xla)).cpu()
    numbers = ~torch.isnan(expected)
    assert torch.equal(got[numbers], expected[numbers])
    assert torch.equal(torch.signbit(got[numbers]), torch.signbit(expected[numbers]))  # -0.0 kept
    assert bool(torch.isnan(got[~numbers]).all())


def test_every_finite_fp8_value_encodes_to_its_code(xla):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = codes.view(torch.float8_e4m3fn)
    numbers = ~torch.isnan(values.float())
    got = bits.fp8_codes(values.to(xla)).cpu()
    assert torch.equal(got[numbers], codes[numbers])


def test_every_fp4_code_decodes_to_its_e2m1_value(xla):
    magnitudes = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    expected = torch.tensor(magnitudes + [-m for m in magnitudes])
    assert torch.equal(bits.fp4_e2m1_decode(torch.arange(16).to(xla)).cpu(), expected)


def test_powers_of_two_are_exact_down_to_the_smallest_subnormal(xla):
    exponents = torch.arange(-149, 128)
    expected = torch.tensor([2.0**int(n) for n in exponents])
    assert torch.equal(numerics.pow2(exponents.to(xla)).cpu(), expected)


def test_the_power_of_two_scale_search_matches_the_host(xla):
    from dsahal.formats.numerics import pow2_scale_at_least

    gen = torch.Generator().manual_seed(3)
    amax = torch.cat([torch.rand(200, generator=gen) * torch.logspace(-30, 30, 200),
                      torch.tensor([0.0, 448.0, 448.0 * 2**-20, 6.0, 6.0 * 2**100, 1.5 * 2.0**127])])
    for qmax, low, high in ((448.0, -126, 127), (6.0, -127, 127)):
        expected = pow2_scale_at_least(amax, qmax, low, high)
        got = numerics.pow2(numerics.pow2_exponent_at_least(amax.to(xla), qmax, low, high)).cpu()
        assert torch.equal(got, expected), f"qmax {qmax}"


def test_e2m1_rounding_matches_the_host_on_every_midpoint_and_sign(xla):
    from dsahal.formats.numerics import e2m1_encode

    grid = torch.tensor([0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0])
    values = torch.cat([grid, -grid, torch.randn(300) * 3])
    assert torch.equal(numerics.e2m1_codes(values.to(xla)).cpu(), e2m1_encode(values).to(torch.int32))


def test_bitcast_round_trips_through_bytes_like_a_host_view(xla):
    values = torch.randn(5, 6)
    raw = bits.to_bytes(values.to(xla))
    assert torch.equal(raw.cpu(), values.view(torch.uint8))
    assert torch.equal(bits.bytes_to(raw, torch.float32).cpu(), values)
