"""Edge cases of the cache layer and the formats found in an audit (each failed before its fix): the fp8 tensor
scale's upper limit, scales stored as fp32, finite error bounds at fp32's limit, records at odd byte offsets,
pools past int32 slots, allocation failures, ids from tensors and NumPy, and slot addresses outside the pool."""
import numpy as np
import pytest
import torch

from dsahal import ops
from dsahal.cache import PackedKVCache, RowAllocator, plan_layout
from dsahal.config import load_config
from dsahal.formats import index_format, latent_format
from dsahal.formats.numerics import FP8_TENSOR_SCALE_MAX

CONFIG = load_config("tiny")  # layers kda, kda, kda, dsa
DSA_LAYER = CONFIG.dsa_layers[0]
F32_MAX = torch.finfo(torch.float32).max


def small_cache(latent_fmt="bf16", index_fmt="fp8", block_tokens=4):
    layout = plan_layout(CONFIG, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens)
    return PackedKVCache(layout, num_rows=layout.rows_per_state + 4)


# -- formats --------------------------------------------------------------------------------------------------


def test_an_fp8_tensor_scale_whose_range_overflows_fp32_is_refused_everywhere():
    fmt = latent_format("fp8")
    too_big = torch.tensor(1e36)  # 448 * 1e36 > fp32 max: a saturated record decoded to Inf
    values = torch.full((1, fmt.dim), 3e38)
    for call in (lambda: fmt.pack(values, too_big), lambda: fmt.unpack(torch.zeros(1, 576, dtype=torch.uint8), too_big),
                 lambda: fmt.error_bound(values, too_big), lambda: fmt.max_abs(too_big)):
        with pytest.raises(ValueError, match=r"latent:fp8\.\w+: argument 'scale' expected a finite value > 0 and at most"):
            call()
    pages = torch.zeros(2, 2, 576, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"dsahal\.cache_write: argument 'scale' expected .* at most 7\.59"):
        ops.cache_write(values, torch.tensor([0]), pages, kind="latent", fmt="fp8", scale=too_big)
    assert not bool(pages.any())
    # The largest accepted scale still decodes every record, saturated ones included, to a finite value.
    largest = torch.tensor(FP8_TENSOR_SCALE_MAX, dtype=torch.float64).float()
    largest = largest if float(largest) <= FP8_TENSOR_SCALE_MAX else torch.nextafter(largest, torch.tensor(0.0))
    out = fmt.unpack(fmt.pack(torch.tensor([[F32_MAX, -F32_MAX] * 288]), largest), largest)
    assert bool(torch.isfinite(out).all())


def test_fp8_max_abs_without_its_scale_names_the_argument():
    with pytest.raises(TypeError, match=r"latent:fp8\.max_abs: argument 'scale' expected a float32 tensor"):
        latent_format("fp8").max_abs()


@pytest.mark.parametrize("fmt", [latent_format("fp8"), latent_format("nvfp4")], ids=str)
def test_error_bound_stays_finite_and_holds_at_the_fp32_limit(fmt):
    # The bound terms (rounding + saturation excess + 2^-22 |x| for a non-power-of-two scale) summed past fp32.
    values = torch.full((2, fmt.dim), F32_MAX)
    values[1, ::2] = -F32_MAX
    scale = torch.tensor(1e-30) if fmt.needs_tensor_scale else None
    bound = fmt.error_bound(values, scale)
    out = fmt.unpack(fmt.pack(values, scale), scale)
    assert bool(torch.isfinite(bound).all()), f"{fmt}: error_bound overflowed to Inf"
    assert bool(((out.double() - values.double()).abs() <= bound.double()).all())


@pytest.mark.parametrize("fmt", [latent_format("bf16"), latent_format("fp8_ds_mla"), index_format("fp8"),
                                 index_format("bf16")], ids=str)
def test_records_cut_from_a_byte_buffer_at_any_offset_unpack(fmt):
    records = fmt.pack(torch.randn(3, fmt.dim))
    for offset in (1, 3):
        buffer = torch.zeros(offset + records.numel(), dtype=torch.uint8)
        buffer[offset:] = records.flatten()
        shifted = buffer[offset:].view(3, fmt.token_bytes)
        assert torch.equal(fmt.unpack(shifted), fmt.unpack(records))
        assert torch.equal(fmt.unpack(shifted[1:2]), fmt.unpack(records[1:2]))


def test_cache_write_names_itself_when_a_written_token_is_not_finite():
    pages = torch.zeros(2, 2, 352, dtype=torch.uint8)
    values = torch.randn(2, 576)
    values[1, 9] = float("nan")
    with pytest.raises(ValueError, match=r"^dsahal\.cache_write: .*argument 'values' expected finite values"):
        ops.cache_write(values, torch.tensor([0, 3]), pages, kind="latent", fmt="nvfp4")
    assert not bool(pages.any())  # nothing written, not even the finite token


# -- the packed cache -------------------------------------------------------------------------------------------


def test_set_latent_scale_checks_the_fp32_value_the_cache_stores():
    cache = small_cache(latent_fmt="fp8")
    cache.set_latent_scale(DSA_LAYER, 0.25)
    for value, match in ((1e-50, "stays > 0 in fp32"), (1e39, "at most"), (1e36, "at most 7.59"), ("2", "a float")):
        with pytest.raises((ValueError, TypeError), match=rf"set_latent_scale: argument 'value' expected .*{match}"):
            cache.set_latent_scale(DSA_LAYER, value)
        assert float(cache.latent_scale(DSA_LAYER)) == 0.25  # unchanged
    cache.set_latent_scale(DSA_LAYER, torch.tensor(0.5))  # an amax / 448 computed as a tensor
    assert float(cache.latent_scale(DSA_LAYER)) == 0.5


def test_a_pool_with_more_slots_than_int32_is_refused_before_allocating():
    layout = plan_layout(CONFIG, block_tokens=64)
    with pytest.raises(ValueError, match=r"PackedKVCache: argument 'num_rows' expected at most 33554432 "):
        PackedKVCache(layout, 2**31 // 64 + 1)
    with pytest.raises(ValueError, match=r"from_budget: argument 'budget_bytes' expected at most"):
        PackedKVCache.from_budget(layout, 2**70)
    with pytest.raises(ValueError, match=r"plan_layout: argument 'block_tokens' expected an int <= 2147483648"):
        plan_layout(CONFIG, block_tokens=2**40)


def test_allocation_failures_and_bad_devices_name_the_cache(monkeypatch):
    layout = plan_layout(CONFIG, block_tokens=4)
    with pytest.raises(ValueError, match=r"PackedKVCache: argument 'device' expected a torch device, got 'gpu0'"):
        PackedKVCache(layout, 2, device="gpu0")

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")

    monkeypatch.setattr(torch, "zeros", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError, match=r"PackedKVCache: argument 'num_rows' expected a pool that fits "
                                                     r"on device cpu, got 1000 rows x \d+ B = \d+ bytes: CUDA out"):
        PackedKVCache(layout, 1000)
    monkeypatch.undo()
    with pytest.raises(TypeError, match=r"from_budget: argument 'layout' expected a CacheLayout, got str"):
        PackedKVCache.from_budget("tiny", 1 << 20)


def test_ids_from_tensors_and_numpy_are_ids_and_other_types_are_named():
    cache = small_cache()
    blocks = cache.allocate_blocks(np.int64(2))
    assert len(blocks) == 2 and cache.block_bytes(np.int64(blocks[0])).shape == (cache.row_bytes,)
    cache.free_blocks([np.int64(blocks[0])])
    cache.free_blocks(torch.tensor([blocks[1]]))
    state = cache.allocate_state()
    cache.free_state(torch.tensor(state))  # was "expected an allocated state id (one of [0]), got tensor(0)"
    assert cache.allocator.free_rows == cache.num_rows
    for call, match in ((lambda: cache.free_blocks([float(blocks[0])]), r"free_blocks: argument 'ids' expected an int, "
                                                                        r"got float"),
                        (lambda: cache.free_blocks(5), r"free_blocks: argument 'ids' expected an iterable"),
                        (lambda: cache.free_blocks(None), r"free_blocks: argument 'ids' expected an iterable"),
                        (lambda: cache.allocate_blocks(2.0), r"allocate_blocks: argument 'n' expected an int"),
                        (lambda: cache.free_state("0"), r"free_state: argument 'state_id' expected an int"),
                        (lambda: RowAllocator("8", 0), r"RowAllocator: argument 'num_rows' expected an int")):
        with pytest.raises(TypeError, match=match):
            call()
    assert cache.allocator.free_rows == cache.num_rows


def test_slot_byte_offsets_refuses_slots_that_are_not_slots_of_the_pool():
    cache = small_cache()
    num_slots = cache.num_rows * cache.block_tokens
    good = cache.slot_byte_offsets(DSA_LAYER, "index", torch.tensor([-1, 0, num_slots - 1]))
    assert good[0] == -1 and 0 <= int(good[2]) < cache.pool.numel()
    for slots, error, match in ((torch.tensor([num_slots]), ValueError, rf"expected values in \[-1, {num_slots - 1}\]"),
                                (torch.tensor([-2]), ValueError, r"expected values in .* got -2"),
                                (torch.tensor([1.5]), TypeError, r"expected an int32 or int64 tensor, got dtype float32"),
                                ([0, 1], TypeError, r"expected an int32 or int64 tensor, got list")):
        with pytest.raises(error, match=r"slot_byte_offsets: argument 'slots' " + match):
            cache.slot_byte_offsets(DSA_LAYER, "index", slots)
    with pytest.raises(ValueError, match=r"argument 'kind' expected 'latent' or 'index', got 'idx'"):
        cache.slot_byte_offsets(DSA_LAYER, "idx", torch.tensor([0]))  # was "layer 3 is not a DSA layer"
