"""The engine's cache allocates the rows the planner describes: whole 256-B pages by default, a power of
two only on request (issue 20: pow2 rows padded the seed's formats by 29-48%)."""
import pytest

from dsahal.cache import PAGE_ALIGN, plan_layout
from dsahal.config import load_config
from dsahal.engine import build_cache

TINY = load_config("tiny")


@pytest.mark.parametrize("latent_fmt,index_fmt", [("bf16", "fp8"), ("nvfp4", "mxfp4"), ("fp8_ds_mla", "fp8")])
def test_the_engine_cache_has_the_planners_page_rows(latent_fmt, index_fmt):
    cache = build_cache(TINY, max_batch=2, max_context=128, latent_fmt=latent_fmt, index_fmt=index_fmt)
    layout = plan_layout(TINY, latent_fmt=latent_fmt, index_fmt=index_fmt)
    assert cache.layout == layout and cache.row_bytes == layout.row_bytes
    assert cache.row_bytes % PAGE_ALIGN == 0 and cache.row_bytes - layout.row_data_bytes < PAGE_ALIGN
    assert tuple(cache.pool.shape) == (cache.num_rows, layout.row_bytes)


def test_tiny_bf16_fp8_rows_hold_no_padding_by_default():
    cache = build_cache(TINY, max_batch=1, max_context=64)
    assert cache.row_bytes == 64 * (1152 + 132) == 82_176  # pow2 would allocate 131,072 B per row


def test_power_of_two_rows_stay_available_on_request():
    cache = build_cache(TINY, max_batch=1, max_context=64, row_rounding="pow2")
    assert cache.row_bytes == 131_072 and cache.layout.row_rounding == "pow2"
    with pytest.raises(ValueError, match="argument 'row_rounding' expected one of"):
        build_cache(TINY, max_batch=1, max_context=64, row_rounding="pow3")


def test_page_rows_keep_fp32_state_views_and_page_views_aligned():
    cache = build_cache(TINY, max_batch=2, max_context=64, latent_fmt="nvfp4", index_fmt="mxfp4")
    for layer in TINY.kda_layers:
        states = cache.kda_states(layer)
        assert states.data_ptr() % PAGE_ALIGN == cache.pool.data_ptr() % PAGE_ALIGN
        states[0].fill_(1.0)  # a write through the view lands inside the pool
    for layer in TINY.dsa_layers:
        assert (cache.latent_pages(layer).stride(0), cache.index_pages(layer).stride(0)) == (cache.row_bytes,) * 2
