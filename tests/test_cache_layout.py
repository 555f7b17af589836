"""Packed cache layout and views, over random model configs: pages of a row never overlap, lie inside the
row and are aligned; rows are whole 256-B pages (powers of two on request); every view aliases the pool; states are aligned fp32."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal.cache import PAGE_ALIGN, PackedKVCache, plan_layout
from dsahal.config import ModelConfig, load_config
from dsahal.formats import INDEX_FORMATS, LATENT_FORMATS

FAST = settings(max_examples=25, deadline=None)


@st.composite
def small_configs(draw):
    kinds = draw(st.lists(st.sampled_from(["kda", "dsa"]), min_size=1, max_size=7))
    if "dsa" not in kinds:
        kinds[draw(st.integers(0, len(kinds) - 1))] = "dsa"
    tp = draw(st.sampled_from([1, 2, 4]))
    heads = tp * draw(st.integers(1, 3))
    config = ModelConfig(name="random", layer_kinds=tuple(kinds), vocab_size=64, hidden_size=64,
                         intermediate_size=64, num_heads=heads, q_lora_rank=16, kda_heads=heads,
                         kda_head_dim=draw(st.sampled_from([8, 16, 32])))
    layout = plan_layout(config, latent_fmt=draw(st.sampled_from(sorted(LATENT_FORMATS))),
                         index_fmt=draw(st.sampled_from(sorted(INDEX_FORMATS))),
                         block_tokens=draw(st.sampled_from([1, 3, 16, 64])), tp=tp,
                         dcp=draw(st.sampled_from([1, 2, 8])), row_rounding=draw(st.sampled_from(["pow2", "page"])))
    # The default rule is page rounding: the same layout as asking for it.
    if layout.row_rounding == "page":
        assert plan_layout(config, latent_fmt=layout.latent_fmt, index_fmt=layout.index_fmt,
                           block_tokens=layout.block_tokens, tp=tp, dcp=layout.dcp) == layout
    return config, layout


@FAST
@given(case=small_configs())
def test_pages_of_a_row_are_disjoint_aligned_and_inside_the_row(case):
    config, layout = case
    spans = sorted((p.offset, p.offset + p.nbytes) for p in layout.pages)
    assert len(spans) == 2 * len(config.dsa_layers)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    assert all(p.offset % PAGE_ALIGN == 0 for p in layout.pages)
    assert spans[0][0] >= 0 and spans[-1][1] == layout.row_data_bytes <= layout.row_bytes


@FAST
@given(case=small_configs())
def test_row_bytes_are_whole_pages_unless_a_power_of_two_is_asked_for(case):
    _, layout = case
    if layout.row_rounding == "pow2":
        assert layout.row_bytes & (layout.row_bytes - 1) == 0
        assert layout.row_bytes < 2 * max(layout.row_data_bytes, PAGE_ALIGN)  # the smallest that fits
    else:
        assert layout.row_bytes % PAGE_ALIGN == 0 and layout.row_bytes - layout.row_data_bytes < PAGE_ALIGN


@FAST
@given(case=small_configs())
def test_kda_states_fit_their_slot_and_do_not_overlap(case):
    config, layout = case
    assert [s.layer for s in layout.states] == config.kda_layers
    spans = sorted((s.offset, s.offset + s.nbytes) for s in layout.states)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start
    assert layout.state_bytes <= layout.rows_per_state * layout.row_bytes
    assert layout.kda_heads_local * layout.tp == config.kda_num_heads


def _pool_offset(view: torch.Tensor, pool: torch.Tensor) -> int:
    return view.data_ptr() - pool.data_ptr()


@FAST
@given(case=small_configs(), seed=st.integers(0, 2**16))
def test_page_views_alias_the_pool_at_the_planned_offsets(case, seed):
    config, layout = case
    cache = PackedKVCache(layout, num_rows=3)
    gen = torch.Generator().manual_seed(seed)
    for layer in config.dsa_layers:
        for kind, view in (("latent", cache.latent_pages(layer)), ("index", cache.index_pages(layer))):
            spec = layout.page(layer, kind)
            assert view.shape == (3, layout.block_tokens, spec.token_bytes) and view.dtype == torch.uint8
            block = int(torch.randint(0, 3, (), generator=gen))
            token = int(torch.randint(0, layout.block_tokens, (), generator=gen))
            view[block, token] = torch.randint(0, 256, (spec.token_bytes,), generator=gen, dtype=torch.uint8)
            start = block * layout.row_bytes + spec.offset + token * spec.token_bytes
            assert torch.equal(cache.pool.view(-1)[start:start + spec.token_bytes], view[block, token])
            slot = torch.tensor([block * layout.block_tokens + token])
            assert int(cache.slot_byte_offsets(layer, kind, slot)) == start
    # a write through one page view never reaches another page
    written = cache.pool.clone()
    cache.latent_pages(config.dsa_layers[0])[1].fill_(0xAB)
    changed = (cache.pool != written).nonzero()
    spec = layout.page(config.dsa_layers[0], "latent")
    assert bool(((changed[:, 0] == 1) & (changed[:, 1] >= spec.offset) &
                 (changed[:, 1] < spec.offset + spec.nbytes)).all())


@FAST
@given(case=small_configs())
def test_kda_state_views_alias_the_pool_and_are_aligned(case):
    config, layout = case
    cache = PackedKVCache(layout, num_rows=2 * layout.rows_per_state + 1)
    if not config.kda_layers:  # a DSA-only model has no state slots at all
        assert layout.rows_per_state == 0 and cache.num_state_slots == 0
        return
    slots = (2 * layout.rows_per_state + 1) // layout.rows_per_state  # whole aligned runs only
    assert cache.num_state_slots == slots
    for layer in config.kda_layers:
        states = cache.kda_states(layer)
        assert states.shape == (slots, layout.kda_heads_local, layout.kda_key_dim, layout.kda_value_dim)
        assert states.dtype == torch.float32 and _pool_offset(states, cache.pool) % PAGE_ALIGN == 0
        states[1, -1, -1, -1] = 3.5
        spec = layout.state(layer)
        end = layout.rows_per_state * layout.row_bytes + spec.offset + spec.nbytes
        assert torch.equal(cache.pool.view(-1)[end - 4:end], torch.tensor([3.5]).view(torch.uint8))


def test_block_bytes_is_one_contiguous_row_holding_all_its_pages():
    config = load_config("tiny")
    layout = plan_layout(config, latent_fmt="nvfp4", index_fmt="mxfp4", block_tokens=16)
    cache = PackedKVCache(layout, num_rows=4)
    layer = config.dsa_layers[0]
    cache.latent_pages(layer)[2].fill_(7)
    cache.index_pages(layer)[2].fill_(9)
    row = cache.block_bytes(2)
    assert row.is_contiguous() and row.shape == (layout.row_bytes,)
    assert row.data_ptr() == cache.pool.data_ptr() + 2 * layout.row_bytes
    copy = torch.empty_like(row)
    copy.copy_(row)  # a block transfer is this one copy
    fresh = PackedKVCache(layout, num_rows=4)
    fresh.block_bytes(0).copy_(copy)
    assert torch.equal(fresh.latent_pages(layer)[0], cache.latent_pages(layer)[2])
    assert torch.equal(fresh.index_pages(layer)[0], cache.index_pages(layer)[2])


def test_fp8_latent_scale_is_a_settable_view_per_layer_and_none_for_other_formats():
    config = load_config("tiny")
    cache = PackedKVCache(plan_layout(config, latent_fmt="fp8"), num_rows=2)
    layer = config.dsa_layers[0]
    scale = cache.latent_scale(layer)
    assert scale.shape == () and scale.dtype == torch.float32 and float(scale) == 1.0
    cache.set_latent_scale(layer, 0.25)
    assert float(scale) == 0.25
    scale.fill_(0.5)
    assert float(cache.latent_scale(layer)) == 0.5
    other = PackedKVCache(plan_layout(config, latent_fmt="nvfp4"), num_rows=2)
    assert other.latent_scale(layer) is None


def test_views_name_the_layer_kind_they_expect():
    config = load_config("tiny")
    cache = PackedKVCache(plan_layout(config), num_rows=2)
    with pytest.raises(ValueError, match=r"layer 0 is not a DSA layer .* DSA layers are \[3\]"):
        cache.latent_pages(0)
    with pytest.raises(ValueError, match=r"layer 3 is not a KDA layer .* KDA layers are \[0, 1, 2\]"):
        cache.kda_states(3)
    with pytest.raises(ValueError, match="argument 'block_id' expected an int in \\[0, 2\\)"):
        cache.block_bytes(2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(tp=3), "argument 'tp' expected a divisor of the kda heads"),
    (dict(block_tokens=0), "argument 'block_tokens' expected an int >= 1"),
    (dict(latent_fmt="fp4"), "unknown latent format 'fp4'"),
    (dict(row_rounding="pow3"), "argument 'row_rounding' expected one of"),
])
def test_plan_layout_rejects_bad_arguments_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_layout(load_config("tiny"), **kwargs)
