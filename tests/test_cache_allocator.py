"""The row allocator under random allocate/free sequences: never owns a row twice, never leaks, fails
atomically, and rejects frees of rows it did not hand out."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsahal.cache import BLOCK, FREE, STATE, CacheFullError, PackedKVCache, RowAllocator, plan_layout
from dsahal.config import load_config

STEP = st.one_of(
    st.tuples(st.just("blocks"), st.integers(0, 9)),
    st.tuples(st.just("free_blocks"), st.integers(1, 5), st.integers(0, 2**16)),
    st.tuples(st.just("state")),
    st.tuples(st.just("free_state"), st.integers(0, 2**16)),
)


def snapshot(alloc: RowAllocator):
    return [alloc.owner(r) for r in range(alloc.num_rows)], alloc.free_rows, alloc.state_slots


def check_invariants(alloc: RowAllocator, blocks: set, states: set):
    owners = [alloc.owner(r) for r in range(alloc.num_rows)]
    state_rows = {r for s in states for r in range(s * alloc.rows_per_state, (s + 1) * alloc.rows_per_state)}
    assert not blocks & state_rows, "a row is owned by a block and a state"
    assert {r for r, o in enumerate(owners) if o == BLOCK} == blocks
    assert {r for r, o in enumerate(owners) if o == STATE} == state_rows
    assert alloc.free_rows == owners.count(FREE) == alloc.num_rows - len(blocks) - len(state_rows)
    assert set(alloc.state_slots) == states


@settings(max_examples=40, deadline=None)
@given(num_rows=st.integers(1, 24), rows_per_state=st.integers(0, 5), program=st.lists(STEP, max_size=40))
def test_random_allocation_sequences_never_double_assign_or_leak(num_rows, rows_per_state, program):
    alloc = RowAllocator(num_rows, rows_per_state)
    blocks, states = set(), set()
    for step in program:
        before = snapshot(alloc)
        if step[0] == "blocks":
            if step[1] > alloc.free_rows:
                with pytest.raises(CacheFullError, match="nothing was allocated"):
                    alloc.allocate_blocks(step[1])
                assert snapshot(alloc) == before
            else:
                got = alloc.allocate_blocks(step[1])
                assert len(got) == len(set(got)) == step[1] and not set(got) & blocks
                blocks |= set(got)
        elif step[0] == "free_blocks" and blocks:
            chosen = sorted(blocks)[step[2] % len(blocks):][: step[1]]
            alloc.free_blocks(chosen)
            blocks -= set(chosen)
        elif step[0] == "state":
            try:
                slot = alloc.allocate_state()
            except CacheFullError:
                assert snapshot(alloc) == before
                # it may only fail when no aligned run of rows_per_state rows is free
                for s in range(alloc.num_state_slots):
                    assert any(alloc.owner(r) != FREE for r in range(s * rows_per_state, (s + 1) * rows_per_state))
            else:
                assert slot not in states
                states.add(slot)
        elif step[0] == "free_state" and states:
            slot = sorted(states)[step[1] % len(states)]
            alloc.free_state(slot)
            states.remove(slot)
        check_invariants(alloc, blocks, states)
    alloc.free_blocks(sorted(blocks))
    for slot in sorted(states):
        alloc.free_state(slot)
    assert alloc.free_rows == num_rows  # nothing leaked
    assert alloc.allocate_blocks(num_rows) and alloc.free_rows == 0


def test_blocks_fill_from_the_top_so_state_slots_stay_whole():
    alloc = RowAllocator(12, 4)
    assert alloc.allocate_blocks(3) == [11, 10, 9]
    assert alloc.allocate_state() == 0 and alloc.allocate_state() == 1
    with pytest.raises(CacheFullError, match="no aligned run of 4 free rows"):
        alloc.allocate_state()  # rows 8..11 hold blocks; one row free but no whole slot


def test_freeing_what_was_not_handed_out_is_an_error_that_changes_nothing():
    alloc = RowAllocator(8, 2)
    rows = alloc.allocate_blocks(2)
    slot = alloc.allocate_state()
    before = snapshot(alloc)
    first_state_row = slot * 2
    cases = [
        (lambda: alloc.free_blocks([rows[0], 0 if rows[0] != 0 else 1]), "is not allocated as a block"),
        (lambda: alloc.free_blocks([first_state_row]), "part of a KDA state"),
        (lambda: alloc.free_blocks([rows[0], rows[0]]), "expected distinct block ids"),
        (lambda: alloc.free_blocks([8]), r"expected block ids in \[0, 8\)"),
        (lambda: alloc.free_state(slot + 1), "expected an allocated state id"),
        (lambda: alloc.allocate_blocks(-1), "expected an int >= 0"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
        assert snapshot(alloc) == before


def test_a_model_without_kda_layers_has_no_states_to_allocate():
    alloc = RowAllocator(4, 0)
    with pytest.raises(CacheFullError, match="no state slot"):
        alloc.allocate_state()


def test_allocate_state_zeroes_every_kda_layer_of_the_state():
    config = load_config("tiny")
    layout = plan_layout(config, block_tokens=4)
    cache = PackedKVCache(layout, num_rows=3 * layout.rows_per_state)
    cache.pool.fill_(0xFF)
    state = cache.allocate_state()
    for layer in config.kda_layers:
        assert bool((cache.kda_states(layer)[state] == 0).all())
        assert bool(torch.isnan(cache.kda_states(layer)[state + 1]).all())  # other slots untouched


def test_from_budget_takes_whole_rows_and_refuses_a_budget_below_one_row():
    layout = plan_layout(load_config("tiny"))
    cache = PackedKVCache.from_budget(layout, 5 * layout.row_bytes + layout.row_bytes // 2)
    assert cache.num_rows == cache.num_blocks == 5
    with pytest.raises(ValueError, match="expected at least one row"):
        PackedKVCache.from_budget(layout, layout.row_bytes - 1)
