"""The FP4 paths of the shared Triton kernels under ``TRITON_INTERPRET=1``: the NVFP4-latent and MXFP4-key
cache-write encoders (byte for byte against ``dsahal.formats``' pack) and the indexer on MXFP4 keys
(against the float64 reference).

The kernels run once, in a subprocess that sets ``TRITON_INTERPRET=1`` before triton is imported; each
test asserts one result. The encoders avoid the interpreter's wrong float -> e4m3 cast by construction
(integer codecs), so their bytes are compared exactly, including rounding ties, the e4m3 scale floor
and cap, UE8M0's ends, saturation, zeros and ``-0.0``. The interpreter's bf16 ``tl.dot`` is wrong, so
the explicit-decode bf16 MMA variant is left to ``scripts/h200/fp4_check.py``; its decode and
addressing are the ones the fp32 variant checks here.
"""
from __future__ import annotations

import json

import pytest

from interpreter_child import child_results, run_groups

ENCODERS = ("latent_nvfp4", "index_mxfp4")


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _pool_pages(num_blocks, block_tokens, token_bytes, *, token_pad, block_pad, offset, seed):
    """``(pool, pages)``: pages ``[num_blocks, block_tokens, token_bytes]`` as a strided view into a larger
    random uint8 pool (``token_pad`` bytes after each record, ``block_pad`` after each block, starting
    ``offset`` bytes in): every byte of the pool outside the records is a guard byte."""
    import torch

    stride_t = token_bytes + token_pad
    stride_b = block_tokens * stride_t + block_pad
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 256, (offset + num_blocks * stride_b,), dtype=torch.uint8, generator=gen)
    pages = pool.as_strided((num_blocks, block_tokens, token_bytes), (stride_b, stride_t, 1), offset)
    return pool, pages


def _e4m3_grid():
    import torch

    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return grid[torch.isfinite(grid)].unique()  # sorted, -448 .. 448


def _nvfp4_values():
    """``[8, 576]`` fp32 latents that hit every rule of the NVFP4 encoder."""
    import torch

    gen = torch.Generator().manual_seed(1)
    grid = _e4m3_grid()
    normal = grid[grid >= 2.0**-6]
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.1, 5.9])
    rows = [torch.randn(576, generator=gen) * 3]
    # e2m1 ties: block j has amax 6·s_j for an e4m3 scale s_j, so x / s_j lands exactly on midpoints
    scales = normal[torch.randint(0, normal.numel(), (32,), generator=gen)]
    signs = torch.where(torch.rand(32, 16, generator=gen) < 0.5, -1.0, 1.0)
    rows.append(torch.cat([(ties * signs * scales[:, None]).reshape(-1), torch.randn(64, generator=gen)]))
    # amax / 6 just above an e4m3 value (rounds up to the next), exactly on one, at the cap (448) and past it
    above = normal[torch.randint(0, normal.numel() - 1, (32,), generator=gen)] * 6 * (1 + 2.0**-20)
    block = torch.randn(32, 16, generator=gen).clamp(-1, 1) * above[:, None] / 6
    block[:, 3] = above
    block[:8] *= 2.0**-8  # some below the 2^-6 floor
    block[28:] = torch.tensor([448.0 * 6, -448.0 * 6 * 1.01, 1e4, -3e5])[:, None] * torch.linspace(-1, 1, 16)
    rows.append(torch.cat([block.reshape(-1), torch.randn(64, generator=gen) * 100]))
    # RoPE: e4m3 midpoints (ties to even), subnormal ties, saturation, -0.0; nope: tiny values and zeros
    mids = (grid[1:] + grid[:-1]) / 2
    rope = mids[torch.randint(0, mids.numel(), (64,), generator=gen)]
    rope[:8] = torch.tensor([3 * 2.0**-10, 5 * 2.0**-10, 2.0**-10, 500.0, -1e5, -0.0, 464.0, 1e-30])
    tiny = torch.randn(512, generator=gen) * 1e-4
    tiny[:16] = 0.0
    tiny[16:32] = -0.0
    tiny[32:48] = 1e-40  # fp32 subnormals
    rows.append(torch.cat([tiny, rope]))
    rows.append(torch.zeros(576))
    rows.append(-torch.zeros(576))
    rows.append(torch.randn(576, generator=gen) * torch.logspace(-6, 3, 576))
    rows.append(torch.randn(576, generator=gen) * 2000)
    return torch.stack(rows).float()


def _mxfp4_values():
    """``[9, 128]`` fp32 index keys that hit every rule of the MXFP4 encoder."""
    import torch

    gen = torch.Generator().manual_seed(2)
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.2, 5.5])
    pow2 = lambda e: torch.ldexp(torch.tensor(1.0), torch.tensor(e))  # noqa: E731
    rows = [torch.randn(128, generator=gen)]
    tie_rows = []
    for e in (-120, -3, 0, 17, 100):  # ties at several exponents: x / 2^e lands exactly on midpoints
        signs = torch.where(torch.rand(32, generator=gen) < 0.5, -1.0, 1.0)
        tie_rows.append(torch.cat([ties, ties]) * signs * pow2(e))
    rows.append(torch.cat(tie_rows[:4]))
    rows.append(torch.cat([tie_rows[4], tie_rows[0], tie_rows[1], tie_rows[2]]))
    # amax exactly 1.5 · 2^a (the scale boundary) and one ulp past it; amax 6 · 2^e and one ulp past
    edges = torch.randn(4, 32, generator=gen).clamp(-1, 1)
    edges[:, 0] = torch.tensor([1.5 * 2.0**5, 1.5 * 2.0**5 * (1 + 2.0**-23), 6.0, 6.0 * (1 + 2.0**-23)])
    rows.append(edges.reshape(-1))
    # huge: at and past the 1.5 · 2^127 saturation, and the largest finite fp32
    huge = torch.randn(4, 32, generator=gen) * 1e37
    huge[:, 0] = torch.tensor([1.5 * 2.0**127, 3.4e38, -3e38, 2.0**127])
    rows.append(huge.reshape(-1))
    # tiny: fp32 subnormals and values whose block takes the smallest scale 2^-127 (byte 0)
    tiny = torch.zeros(4, 32)
    tiny[0] = torch.randn(32, generator=gen) * 1e-39
    tiny[1] = torch.tensor([3 * 2.0**-128, 2.0**-129, 2.0**-149, -(2.0**-130)] * 8)
    tiny[2] = -0.0
    tiny[3] = torch.randn(32, generator=gen) * 2.0**-120
    rows.append(tiny.reshape(-1))
    rows.append(torch.zeros(128))
    rows.append(torch.randn(128, generator=gen) * torch.exp2(torch.linspace(-60, 60, 128)))
    rows.append(torch.randn(128, generator=gen) * 1e20)
    return torch.stack(rows).float()


def _codec_cases(results):
    """The integer codecs of ``bytes`` against torch's e4m3 cast and the format's own rounding helpers."""
    import torch
    import triton
    import triton.language as tl

    from dsahal.backends.triton_kernels.bytes import e4m3_bits
    from dsahal.formats.numerics import e4m3_round_up

    globals()["e4m3_bits"] = e4m3_bits  # the interpreter resolves a kernel's callees in its module globals

    @triton.jit
    def codes(x_ptr, nearest_ptr, up_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        x = tl.load(x_ptr + offs)
        tl.store(nearest_ptr + offs, e4m3_bits(tl.minimum(tl.maximum(x, -448.0), 448.0), False))
        tl.store(up_ptr + offs, e4m3_bits(tl.minimum(tl.maximum(tl.abs(x), 2.0**-6), 448.0), True))

    grid = _e4m3_grid()
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([grid, (grid[1:] + grid[:-1]) / 2, torch.randn(400, generator=gen) * 50,
                   torch.randn(100, generator=gen) * 1e-3, torch.tensor([0.0, -0.0, 1e-40, -1e-42, 500.0, -1e30])])
    x = torch.cat([x, torch.randn(1024 - x.numel(), generator=gen)]).float()
    nearest, up = torch.empty(1024, dtype=torch.int32), torch.empty(1024, dtype=torch.int32)
    codes[(1,)](x, nearest, up, N=1024)
    results["codec_e4m3_nearest_even"] = torch.equal(
        nearest, x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).int())
    results["codec_e4m3_round_up"] = torch.equal(
        up, e4m3_round_up(x.abs().clamp(2.0**-6, 448)).view(torch.uint8).int())


def _cache_write_cases(results):
    import torch

    from dsahal.backends.triton_kernels.cache_write import cache_write
    from dsahal.formats import cache_format

    for (kind, fmt), values in ((("latent", "nvfp4"), _nvfp4_values()), (("index", "mxfp4"), _mxfp4_values())):
        spec = cache_format(kind, fmt)
        tokens = values.shape[0]
        # packed pages; records at odd addresses with padding after each record and block (guard bytes)
        layouts = (dict(token_pad=0, block_pad=0, offset=0), dict(token_pad=5, block_pad=37, offset=3))
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            source = values if dtype == torch.float32 else values.clamp(-6e4, 6e4).to(dtype)
            if dtype == torch.bfloat16:  # the interpreter widens bf16 subnormals wrongly (1e-39 -> 4.4e-39):
                # signed zeros there; the fp32 run keeps its subnormal inputs, the GPU script keeps them in bf16
                source = torch.where(source.float().abs() < 2.0**-126, source * 0, source)
            for layout in layouts if dtype == torch.float32 else layouts[1:]:
                pool, pages = _pool_pages(4, 4, spec.token_bytes, seed=tokens, **layout)
                want_pool = pool.clone()
                want_pages = want_pool.as_strided(pages.shape, pages.stride(), pages.storage_offset())
                slots = torch.randperm(16)[:tokens].to(torch.int32)
                slots[1] = -1  # skipped
                slots[4] = 16 + 5  # past the last slot: skipped
                keep = (slots >= 0) & (slots < 16)
                for slot, record in zip(slots[keep].tolist(), spec.pack(source[keep]).unbind(0)):
                    want_pages[slot // 4, slot % 4] = record
                cache_write(source, slots, pages, kind, fmt, None)
                name = f"cache_write_{kind}_{fmt}_{str(dtype).split('.')[-1]}_pad{layout['token_pad']}"
                results[name] = torch.equal(pool, want_pool)  # records byte-exact and every guard byte kept


def _mxfp4_pages(num_blocks, block_tokens):
    """Random MXFP4 keys whose 32-dim blocks span scales 2^-20 .. 2^20 (so the UE8M0 bytes differ), a few
    all-zero keys among them."""
    import torch

    from dsahal.formats import index_format

    gen = torch.Generator().manual_seed(4)
    tokens = num_blocks * block_tokens
    spread = torch.exp2(torch.randint(-20, 21, (tokens, 4, 1), generator=gen).float()).expand(-1, -1, 32)
    values = torch.randn(tokens, 128, generator=gen) * spread.reshape(tokens, 128)
    values[::17] = 0.0
    return index_format("mxfp4").pack(values).view(num_blocks, block_tokens, -1)


def _indexer_cases(results):
    import torch

    from dsahal.backends.triton_kernels.indexer import DOT_FP32, indexer_score
    from dsahal.reference.indexer import indexer_score as reference

    pages = _mxfp4_pages(12, 16)
    _, strided = _pool_pages(12, 16, 68, token_pad=4, block_pad=20, offset=1, seed=5)
    strided.copy_(pages)  # odd record addresses, 72-byte token stride, padded blocks
    table = torch.tensor([[3, 1, 0, 7, -1, 5], [2, 4, 6, 8, 999, 10]], dtype=torch.int32)  # -1, 999 unmapped
    safe_table = torch.where(table >= 12, -1, table)
    req = torch.tensor([0, 0, 0, 1, 1, 0, 1, 1, 1], dtype=torch.int32)
    pos = torch.tensor([50, 51, 95, 10, 70, 20, 71, 72, 95], dtype=torch.int32)
    gen = torch.Generator().manual_seed(6)
    q32 = torch.randn(9, 4, 128, generator=gen)
    w = torch.randn(9, 4, generator=gen)
    tile = dict(block_n=32, group=2, tiles=2)
    # (case, q dtype, launch options, sources): the exact fp32 decode on per-key and one-block (16-key
    # tiles on 16-token blocks) addressing, packed and strided pools; tl.dot_scaled for bf16 / fp8 queries
    # with keys as either MMA operand and in the rolled loop; bf16 / fp8 query loads into the fp32 decode
    cases = (
        ("fp32_per_key", torch.float32, dict(tile), (pages, strided)),
        ("fp32_one_block", torch.float32, dict(tile, block_n=16), (pages,)),
        ("fp32_per_key_16", torch.float32, dict(tile, block_n=16, one_block_tiles=False), (pages,)),
        ("fp16", torch.float16, dict(tile), (pages,)),
        ("bf16_dot_scaled", torch.bfloat16, dict(tile), (pages, strided)),
        ("bf16_dot_scaled_keys_as_b", torch.bfloat16, dict(tile, keys_as_b=True), (pages,)),
        ("bf16_dot_scaled_one_block_pipelined", torch.bfloat16, dict(tile, block_n=16, pipeline=True), (pages,)),
        ("bf16_dot_scaled_fast_math", torch.bfloat16, dict(tile, mxfp4_fast_math=True), (pages,)),
        ("fp8_dot_scaled", torch.float8_e4m3fn, dict(tile), (pages,)),
        ("fp8_dot_scaled_keys_as_b", torch.float8_e4m3fn, dict(tile, keys_as_b=True), (strided,)),
        ("bf16_fp32_decode", torch.bfloat16, dict(tile, dot=DOT_FP32), (pages,)),
        ("fp8_fp32_decode", torch.float8_e4m3fn, dict(tile, dot=DOT_FP32), (pages,)),
    )
    wants = {}
    for name, q_dtype, options, sources in cases:
        q = q32.to(q_dtype)
        if q_dtype not in wants:
            wants[q_dtype] = reference(q.float(), w, pages, safe_table, req, pos, "mxfp4", 100)
        want = wants[q_dtype]
        finite = torch.isfinite(want)
        ok = True
        for source in sources:
            got = indexer_score(q, w, source, table, req, pos, "mxfp4", 100, **options)
            ok &= torch.equal(torch.isfinite(got), finite) and _rel(got[finite], want[finite]) < 1e-5
        results[f"indexer_mxfp4_{name}"] = ok
    want = wants[torch.float32]
    results["indexer_mxfp4_masks_causal_and_unmapped"] = bool(
        torch.isneginf(want[0, 51:]).all() and torch.isneginf(want[3, 11:]).all()  # causal
        and torch.isneginf(want[2, 64:80]).all() and torch.isfinite(want[2, 80:96]).all()  # table -1, then mapped
        and torch.isneginf(want[4, 64:]).all()  # block id 999: out of the pool
        and torch.isfinite(want[:, :11]).all())


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_codec_cases, _cache_write_cases, _indexer_cases))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


@pytest.mark.parametrize("case", ["nearest_even", "round_up"])
def test_integer_e4m3_codec_matches_torch_cast_and_the_formats_round_up(interpreted, case):
    assert interpreted[f"codec_e4m3_{case}"]


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_fp4_cache_write_is_byte_identical_to_pack_and_keeps_guard_bytes_of_strided_pages(interpreted, encoder,
                                                                                        dtype):
    assert interpreted[f"cache_write_{encoder}_{dtype}_pad5"]


@pytest.mark.parametrize("encoder", ENCODERS)
def test_fp4_cache_write_into_packed_pages_skips_invalid_slots(interpreted, encoder):
    assert interpreted[f"cache_write_{encoder}_float32_pad0"]


@pytest.mark.parametrize("case", ["fp32_per_key", "fp32_one_block", "fp32_per_key_16", "fp16", "bf16_dot_scaled",
                                  "bf16_dot_scaled_keys_as_b", "bf16_dot_scaled_one_block_pipelined",
                                  "bf16_dot_scaled_fast_math",
                                  "fp8_dot_scaled", "fp8_dot_scaled_keys_as_b", "bf16_fp32_decode",
                                  "fp8_fp32_decode"])
def test_indexer_on_mxfp4_keys_matches_the_reference(interpreted, case):
    assert interpreted[f"indexer_mxfp4_{case}"]


def test_indexer_reference_case_has_masked_and_visible_scores(interpreted):
    """The comparison above is not vacuous: causal bounds and unmapped blocks mask part of every row."""
    assert interpreted["indexer_mxfp4_masks_causal_and_unmapped"]


def test_mxfp4_limits_and_launch_errors():
    """The shared limits accept the FP4 formats; the launchers reject what their kernels cannot do,
    naming the op and the argument, before anything is launched."""
    pytest.importorskip("triton")
    import torch

    from dsahal.backends.triton_kernels import limits
    from dsahal.backends.triton_kernels.cache_write import cache_write
    from dsahal.backends.triton_kernels.indexer import DOT_FP8, indexer_score

    anywhere = dict(device_check=lambda **tensors: (True, ""))
    pages = torch.zeros(2, 16, 68, dtype=torch.uint8)
    table, ids = torch.zeros(1, 2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    q, w = torch.zeros(3, 4, 128), torch.zeros(3, 4)
    assert limits.indexer_score(q, w, pages, table, ids, ids, "mxfp4", 32, **anywhere) == (True, "")
    for kind, fmt in (("latent", "nvfp4"), ("index", "mxfp4")):
        assert limits.cache_write(q[:, 0], ids, pages, kind, fmt, None, **anywhere) == (True, "")
    with pytest.raises(ValueError, match=r"indexer_score: mxfp4 keys .* got dot=DOT_FP8"):
        indexer_score(q.to(torch.float8_e4m3fn), w, pages, table, ids, ids, "mxfp4", 32, dot=DOT_FP8)
    with pytest.raises(ValueError, match=r"indexer_score: index_fmt must be one of .* got 'nvfp4'"):
        indexer_score(q, w, pages, table, ids, ids, "nvfp4", 32)
    with pytest.raises(ValueError, match=r"cache_write: index:mxfp4 writes 128 values per token, got .*\[3, 64\]"):
        cache_write(torch.zeros(3, 64), ids, pages, "index", "mxfp4", None)


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
