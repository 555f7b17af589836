"""Issue 22, "malformed calls that get through or are misreported": one test per case.

Every rejection is asserted whole against the documented shape
``dsahal.<op>: argument '<name>' expected <what>, got <what>`` (op and argument named, both sides given),
plus the fragment that says what was wrong. Also: legitimate packed-pool views stay accepted, cache_write
never writes outside its target records (guard bytes around strided pages), and a float64 KDA gate is valid.
"""
import re

import pytest
import torch

from dsahal import ops
from dsahal.backends.triton_kernels import limits
from dsahal.cache import PackedKVCache, plan_layout
from dsahal.config import load_config
from dsahal.distributed.testing import run_on_ranks
from dsahal.formats import INDEX_FORMATS, LATENT_FORMATS, cache_format

I32 = torch.int32
U8 = torch.uint8
META = torch.device("meta")  # shapes without storage: counts past int32 cost no memory


def rejects(call, error, op, arg, *fragments):
    """``call()`` raises ``error`` whose whole message has the documented shape for ``op`` and ``arg``."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    shape = rf"dsahal\.{re.escape(op)}: argument '{re.escape(arg)}' expected .+, got .+"
    assert re.fullmatch(shape, message, flags=re.S), f"not the documented shape: {message}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    return message


# ---------------------------------------------------------------------------- argument builders

def pages(blocks=2, block_tokens=4, token_bytes=1152):
    return torch.zeros(blocks, block_tokens, token_bytes, dtype=U8)


GUARD = 16  # random guard bytes on each side of a strided view


def strided_pages(shape, strides):
    """A view ``shape``/``strides`` into a pool of random bytes: the view's span plus guard bytes around it."""
    size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    pool = torch.randint(0, 256, (size + 2 * GUARD,), dtype=U8, generator=torch.Generator().manual_seed(0))
    return pool.as_strided(shape, strides, GUARD)


def storage_of(view):
    """The whole tensor a view was taken from (guard bytes included)."""
    return view._base if view._base is not None else view


def half_overlapping(blocks=2, block_tokens=4, token_bytes=1152):
    """Token records that start half a record apart: each shares bytes with its neighbour."""
    return strided_pages((blocks, block_tokens, token_bytes), (block_tokens * token_bytes, token_bytes // 2, 1))


def aliasing_other_blocks(blocks=2, block_tokens=4, token_bytes=1152):
    """Blocks that start two records apart: block 1's first records are block 0's last ones."""
    return strided_pages((blocks, block_tokens, token_bytes), (2 * token_bytes, token_bytes, 1))


def one_block_for_all(blocks=3, block_tokens=4, token_bytes=1152):
    """``expand``: every block is the same memory (stride 0)."""
    return pages(1, block_tokens, token_bytes).expand(blocks, block_tokens, token_bytes)


ALIASED_PAGES = {"half-overlapping records": half_overlapping, "blocks aliasing other blocks": aliasing_other_blocks,
                 "every block the same memory": one_block_for_all}


def call_write(**over):
    a = dict(values=torch.randn(2, 576), slots=torch.tensor([0, 3]), pages=pages(), kind="latent", fmt="bf16",
             scale=None)
    a.update(over)
    return lambda: ops.cache_write(a["values"], a["slots"], a["pages"], kind=a["kind"], fmt=a["fmt"],
                                   scale=a["scale"])


def call_indexer(**over):
    a = dict(q=torch.randn(3, 2, 128), weights=torch.rand(3, 2), index_pages=pages(token_bytes=132),
             block_table=torch.tensor([[0, 1]], dtype=I32), req_ids=torch.zeros(3, dtype=I32),
             positions=torch.tensor([0, 1, 7], dtype=I32), index_fmt="fp8", max_context=8)
    a.update(over)
    return lambda: ops.indexer_score(a["q"], a["weights"], a["index_pages"], a["block_table"], a["req_ids"],
                                     a["positions"], index_fmt=a["index_fmt"], max_context=a["max_context"])


def call_mla(**over):
    a = dict(q=torch.randn(2, 3, 576), kv_pages=pages(), slots=torch.tensor([[0, 5], [-1, 7]], dtype=I32),
             kv_fmt="bf16", kv_scale=None, softmax_scale=0.1)
    a.update(over)
    return lambda: ops.sparse_mla(a["q"], a["kv_pages"], a["slots"], kv_fmt=a["kv_fmt"], kv_scale=a["kv_scale"],
                                  softmax_scale=a["softmax_scale"])


def dsa_args(**over):
    a = dict(q_index=torch.randn(3, 2, 128), index_weights=torch.rand(3, 2), index_pages=pages(token_bytes=132),
             q=torch.randn(3, 4, 576), kv_pages=pages(), block_table=torch.tensor([[0, 1]], dtype=I32),
             req_ids=torch.zeros(3, dtype=I32), positions=torch.tensor([0, 1, 7], dtype=I32), index_fmt="fp8",
             kv_fmt="bf16", kv_scale=None, topk=4, max_context=8, softmax_scale=0.1)
    a.update(over)
    return a


def call_dsa(**over):
    a = dsa_args(**over)
    return lambda: ops.dsa_attention(**a)


def kda_args(lead=2, **over):
    a = dict(q=torch.randn(lead, 2, 8), k=torch.randn(lead, 2, 8), v=torch.randn(lead, 2, 4),
             g=-torch.rand(lead, 2, 8), beta=torch.rand(lead, 2), state_pool=torch.zeros(3, 2, 8, 4),
             state_ids=torch.tensor([0, 2], dtype=I32), use_qk_l2norm=True)
    a.update(over)
    return a


def call_kda_decode(**over):
    a = kda_args(**over)
    return lambda: ops.kda_decode(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state_pool"], a["state_ids"],
                                  use_qk_l2norm=a["use_qk_l2norm"])


def call_kda_prefill(**over):
    a = kda_args(lead=5, **over)
    cu = torch.tensor([0, 2, 5], dtype=I32)
    return lambda: ops.kda_prefill(a["q"], a["k"], a["v"], a["g"], a["beta"], cu, a["state_pool"],
                                   a["state_ids"], use_qk_l2norm=a["use_qk_l2norm"])


def aliased_pools():
    """State pools ``[3, 2, 8, 4]`` whose rows share memory: expanded, or rows half a state apart."""
    state = 2 * 8 * 4
    return {"every state the same memory": torch.zeros(1, 2, 8, 4).expand(3, 2, 8, 4),
            "states half a state apart": torch.zeros(3 * state).as_strided((3, 2, 8, 4), (state // 2, 32, 4, 1))}


KDA_CALLS = {"kda_decode": call_kda_decode, "kda_prefill": call_kda_prefill}
SHARES = "share memory"


# ---------------------------------------------------------------------------- aliased pages and pools

@pytest.mark.parametrize("layout", ALIASED_PAGES)
def test_cache_write_rejects_pages_whose_records_share_bytes_and_writes_nothing(layout):
    target = ALIASED_PAGES[layout]()
    before = storage_of(target).clone()
    rejects(call_write(pages=target), ValueError, "cache_write", "pages", SHARES, "strides")
    assert torch.equal(storage_of(target), before)  # no byte changed, guard bytes included


@pytest.mark.parametrize("layout", ALIASED_PAGES)
def test_indexer_score_rejects_aliased_index_pages(layout):
    rejects(call_indexer(index_pages=ALIASED_PAGES[layout](token_bytes=132)), ValueError, "indexer_score",
            "index_pages", SHARES)


@pytest.mark.parametrize("layout", ALIASED_PAGES)
def test_sparse_mla_rejects_aliased_kv_pages(layout):
    rejects(call_mla(kv_pages=ALIASED_PAGES[layout]()), ValueError, "sparse_mla", "kv_pages", SHARES)


@pytest.mark.parametrize("arg,token_bytes", [("index_pages", 132), ("kv_pages", 1152)])
@pytest.mark.parametrize("layout", ALIASED_PAGES)
def test_dsa_attention_rejects_aliased_pages_under_its_own_name(layout, arg, token_bytes):
    blocks = 2 if layout != "every block the same memory" else 3
    over = {arg: ALIASED_PAGES[layout](blocks=blocks, token_bytes=token_bytes)}
    if blocks == 3:  # the other pages must keep the same blocks, or the block-count check speaks first
        other = "kv_pages" if arg == "index_pages" else "index_pages"
        over[other] = pages(blocks=3, token_bytes=1152 if other == "kv_pages" else 132)
    rejects(call_dsa(**over), ValueError, "dsa_attention", arg, SHARES)


@pytest.mark.parametrize("op", KDA_CALLS)
@pytest.mark.parametrize("layout", list(aliased_pools()))
def test_kda_rejects_a_state_pool_whose_rows_alias(op, layout):
    pool = aliased_pools()[layout]
    before = pool.clone()
    rejects(KDA_CALLS[op](state_pool=pool), ValueError, op, "state_pool", SHARES)
    assert torch.equal(pool, before)


@pytest.mark.parametrize("latent_fmt,index_fmt,block_tokens", [("bf16", "fp8", 4), ("fp8_ds_mla", "mxfp4", 3),
                                                               ("nvfp4", "bf16", 16)])
def test_packed_pool_views_stay_accepted(latent_fmt, index_fmt, block_tokens):
    """The real views: pages with stride(0) = row_bytes (other layers' bytes between blocks), KDA states
    as strided row runs. Every op that takes them runs, and bytes outside what it writes stay put."""
    config = load_config("tiny")
    layout = plan_layout(config, latent_fmt=latent_fmt, index_fmt=index_fmt, block_tokens=block_tokens)
    cache = PackedKVCache(layout, num_rows=2 * layout.rows_per_state + 2)
    layer, kda_layer = config.dsa_layers[0], config.kda_layers[0]
    latent, index = cache.latent_pages(layer), cache.index_pages(layer)
    assert latent.stride(0) == layout.row_bytes > block_tokens * latent.shape[2]  # a real strided view
    slots = torch.tensor([0, block_tokens + 1], dtype=I32)
    ops.cache_write(torch.randn(2, 576), slots, latent, kind="latent", fmt=latent_fmt, scale=cache.latent_scale(layer))
    ops.cache_write(torch.randn(2, 128), slots, index, kind="index", fmt=index_fmt)
    blocks = cache.num_blocks
    table = torch.arange(blocks, dtype=I32)[None]
    positions = torch.tensor([0, block_tokens + 1], dtype=I32)
    req_ids = torch.zeros(2, dtype=I32)
    scores = ops.indexer_score(torch.randn(2, 4, 128), torch.rand(2, 4), index, table, req_ids, positions,
                               index_fmt=index_fmt, max_context=blocks * block_tokens)
    assert scores.shape == (2, blocks * block_tokens)
    o, lse = ops.sparse_mla(torch.randn(2, 3, 576), latent, slots[None].expand(2, 2).contiguous(), kv_fmt=latent_fmt,
                            kv_scale=cache.latent_scale(layer), softmax_scale=0.1)
    assert torch.isfinite(lse).all()
    ops.dsa_attention(torch.randn(2, 4, 128), torch.rand(2, 4), index, torch.randn(2, 3, 576), latent, table,
                      req_ids, positions, index_fmt=index_fmt, kv_fmt=latent_fmt, kv_scale=cache.latent_scale(layer),
                      topk=2, max_context=blocks * block_tokens, softmax_scale=0.1)
    states = cache.kda_states(kda_layer)
    assert states.stride(0) > states[0].numel()  # state slots are row runs, not contiguous states
    heads, key_dim, value_dim = states.shape[1:]
    pool_before = cache.pool.clone()
    ids = torch.tensor([1], dtype=I32)
    ops.kda_decode(torch.randn(1, heads, key_dim), torch.randn(1, heads, key_dim), torch.randn(1, heads, value_dim),
                   -torch.rand(1, heads, key_dim), torch.rand(1, heads), states, ids)
    ops.kda_prefill(torch.randn(3, heads, key_dim), torch.randn(3, heads, key_dim), torch.randn(3, heads, value_dim),
                    -torch.rand(3, heads, key_dim), torch.rand(3, heads), torch.tensor([0, 3], dtype=I32), states, ids)
    changed = (cache.pool.view(-1) != pool_before.view(-1)).nonzero().flatten()
    state = layout.state(kda_layer)
    first = layout.rows_per_state * layout.row_bytes + state.offset  # state id 1 of this layer
    assert changed.numel() and bool(((changed >= first) & (changed < first + state.nbytes)).all())


FORMATS = [("latent", f) for f in sorted(LATENT_FORMATS)] + [("index", f) for f in sorted(INDEX_FORMATS)]


@pytest.mark.parametrize("kind,fmt", FORMATS, ids=[f"{k}:{f}" for k, f in FORMATS])
def test_cache_write_never_writes_outside_its_target_records(kind, fmt):
    """Pages as a padded, offset view into a pool of random guard bytes (like the packed cache's rows):
    the reference writes exactly the target records, each equal to the format's own packing."""
    spec = cache_format(kind, fmt)
    blocks, block_tokens, row, offset = 3, 4, 4 * spec.token_bytes + 37, 11  # 37 bytes of padding per row
    pool = torch.randint(0, 256, (offset + blocks * row + 23,), dtype=U8, generator=torch.Generator().manual_seed(1))
    before = pool.clone()
    target = pool.as_strided((blocks, block_tokens, spec.token_bytes), (row, spec.token_bytes, 1), offset)
    slots = torch.tensor([5, -1, 0, 11, 6])
    values = torch.randn(5, spec.dim, generator=torch.Generator().manual_seed(2))
    scale = torch.tensor(0.5) if spec.needs_tensor_scale else None
    ops.cache_write(values, slots, target, kind=kind, fmt=fmt, scale=scale)
    expected = before.clone()
    packed = spec.pack(values, scale)
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            start = offset + (slot // block_tokens) * row + (slot % block_tokens) * spec.token_bytes
            expected[start:start + spec.token_bytes] = packed[i]
    assert torch.equal(pool, expected)


# ---------------------------------------------------------------------------- ids and int32 addresses

def test_positions_to_slots_rejects_block_ids_below_minus_one():
    rejects(lambda: ops.positions_to_slots(torch.zeros(1, 2, dtype=I32), torch.zeros(1, dtype=I32),
                                           torch.tensor([[0, -3]], dtype=I32), 4),
            ValueError, "positions_to_slots", "block_table", "got -3")


@pytest.mark.parametrize("op,call", [("indexer_score", lambda: call_indexer(block_table=torch.tensor([[-3, 1]], dtype=I32))),
                                     ("dsa_attention", lambda: call_dsa(block_table=torch.tensor([[0, -3]], dtype=I32)))])
def test_block_ids_below_minus_one_are_rejected_where_blocks_are_read(op, call):
    rejects(call(), ValueError, op, "block_table", "got -3", "-1: unmapped")


def test_a_block_id_whose_slot_overflows_int32_is_rejected():
    # 2^30 * 4 tokens per block = 2^32: the int32 slot would wrap around
    rejects(lambda: ops.positions_to_slots(torch.zeros(1, 1, dtype=I32), torch.zeros(1, dtype=I32),
                                           torch.tensor([[2**30]], dtype=I32), 4),
            ValueError, "positions_to_slots", "block_table", f"[-1, {2**29 - 1}]", "got 1073741824")


@pytest.mark.parametrize("op", ["cache_write", "sparse_mla", "indexer_score"])
def test_page_slot_counts_past_int32_are_rejected_from_metadata(op):
    huge = torch.empty(2**30, 4, 132 if op == "indexer_score" else 1152, dtype=U8, device=META)
    if op == "cache_write":
        call = call_write(values=torch.empty(2, 576, device=META), slots=torch.empty(2, dtype=torch.int64, device=META),
                          pages=huge)
        arg = "pages"
    elif op == "sparse_mla":
        call, arg = call_mla(q=torch.empty(2, 3, 576, device=META), kv_pages=huge,
                             slots=torch.empty(2, 2, dtype=I32, device=META)), "kv_pages"
    else:
        call = call_indexer(**{name: t.to(META) for name, t in dict(
            q=torch.randn(3, 2, 128), weights=torch.rand(3, 2), block_table=torch.tensor([[0, 1]], dtype=I32),
            req_ids=torch.zeros(3, dtype=I32), positions=torch.tensor([0, 1, 7], dtype=I32)).items()},
            index_pages=huge)
        arg = "index_pages"
    rejects(call, ValueError, op, arg, "slots are int32", f"at most {2**31}", f"got {2**32}")


def test_a_block_table_mapping_more_than_int32_positions_is_rejected():
    table = torch.empty(1, 2**30, dtype=I32, device=META)
    rejects(lambda: ops.positions_to_slots(torch.empty(1, 1, dtype=I32, device=META),
                                           torch.empty(1, dtype=I32, device=META), table, 4),
            ValueError, "positions_to_slots", "block_table", "positions are int32", f"got {2**32}")


# ---------------------------------------------------------------------------- flags, scales, positions

@pytest.mark.parametrize("op", KDA_CALLS)
@pytest.mark.parametrize("flag", ["no", 1, None])
def test_use_qk_l2norm_must_be_a_bool(op, flag):
    rejects(KDA_CALLS[op](use_qk_l2norm=flag), TypeError, op, "use_qk_l2norm", "expected a bool",
            type(flag).__name__)


def test_dsa_attention_rejects_a_position_past_max_context():
    # positions [0, 1, 7] need max_context >= 8
    rejects(call_dsa(max_context=7), ValueError, "dsa_attention", "positions", "[0, 6]", "max_context=7",
            "got 7")


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("width", [0, 2], ids=["no-slots", "all-minus-one"])
def test_sparse_mla_rejects_a_bad_kv_scale_even_when_every_row_is_empty(scale, width):
    slots = torch.full((2, width), -1, dtype=I32)
    rejects(call_mla(kv_fmt="fp8", kv_pages=pages(token_bytes=576), slots=slots, kv_scale=torch.tensor(scale)),
            ValueError, "sparse_mla", "kv_scale", "finite value > 0", f"got {scale}")


def test_cache_write_rejects_a_zero_scale_under_its_own_name():
    # (the format's pack would say dsahal.formats.latent:fp8.pack)
    rejects(call_write(fmt="fp8", pages=pages(token_bytes=576), scale=torch.tensor(0.0)), ValueError,
            "cache_write", "scale", "got 0.0")


# ---------------------------------------------------------------------------- dsa_attention's own name

DSA_MALFORMED = {
    # (changes, error, argument, fragment): each used to name sparse_mla, indexer_score, a format or 'weights'
    "index_weights dtype": (dict(index_weights=torch.rand(3, 2).double()), TypeError, "index_weights", "float64"),
    "index_weights heads": (dict(index_weights=torch.rand(3, 3)), ValueError, "index_weights", "Hi=2 from 'q_index'"),
    "q_index dim": (dict(q_index=torch.randn(3, 2, 64)), ValueError, "q_index", "[T, Hi, 128]"),
    "q_index dtype": (dict(q_index=torch.randn(3, 2, 128).double()), TypeError, "q_index", "float64"),
    "index_fmt": (dict(index_fmt="fp9"), ValueError, "index_fmt", "got 'fp9'"),
    "kv_fmt": (dict(kv_fmt="fp9"), ValueError, "kv_fmt", "got 'fp9'"),
    "kv_scale zero": (dict(kv_fmt="fp8", kv_pages=pages(token_bytes=576), kv_scale=torch.tensor(0.0)), ValueError,
                      "kv_scale", "got 0.0"),
    "kv_scale missing": (dict(kv_fmt="fp8", kv_pages=pages(token_bytes=576)), TypeError, "kv_scale", "got None"),
    "kv_pages record size": (dict(kv_pages=pages(token_bytes=1000)), ValueError, "kv_pages", "1152"),
    "index_pages dtype": (dict(index_pages=torch.zeros(2, 4, 132)), TypeError, "index_pages", "uint8"),
    "q heads dim": (dict(q=torch.randn(3, 4, 512)), ValueError, "q", "[T, H, 576]"),
    "q tokens": (dict(q=torch.randn(4, 4, 576)), ValueError, "q", "T=3 from 'q_index'"),
    "softmax_scale": (dict(softmax_scale=0.0), ValueError, "softmax_scale", "got 0.0"),
    "req_ids range": (dict(req_ids=torch.ones(3, dtype=I32)), ValueError, "req_ids", "got 1"),
    "positions range": (dict(positions=torch.tensor([0, 1, 8], dtype=I32), max_context=9), ValueError, "positions",
                        "got 8"),
    "max_context": (dict(max_context=0), ValueError, "max_context", "got 0"),
}


@pytest.mark.parametrize("case", DSA_MALFORMED)
def test_dsa_attention_reports_its_own_name_and_argument_names(case):
    changes, error, arg, fragment = DSA_MALFORMED[case]
    message = rejects(call_dsa(**changes), error, "dsa_attention", arg, fragment)
    for inner in ("dsahal.sparse_mla", "dsahal.indexer_score", "dsahal.formats", "'weights'"):
        assert inner not in message


# ---------------------------------------------------------------------------- collectives

@pytest.mark.parametrize("op,call", [
    ("all_gather", lambda: ops.all_gather(torch.randn(2), group=object())),
    ("all_to_all", lambda: ops.all_to_all(torch.randn(2, 3), group=object())),
    ("topk_merge", lambda: ops.topk_merge(torch.randn(2, 4), torch.full((2,), 4, dtype=I32), 2, group=object())),
])
def test_a_group_without_torch_distributed_names_the_op(op, call):
    rejects(call, ValueError, op, "group", "not initialised", "got object")


def test_all_to_all_output_sizes_that_a_single_rank_does_not_send_itself_are_rejected():
    rejects(lambda: ops.all_to_all(torch.randn(4, 2), [5], [4]), ValueError, "all_to_all", "output_split_sizes",
            "[4]", "got [5]")


def all_to_all_with_splits(rank, world):
    """Rank 1 expects [2, 2] rows though rank 0 sends it 3: every rank must raise the same error (none may
    hang in the transfer). A consistent call afterwards still moves the right rows."""
    from dsahal.distributed import init_distributed, shutdown_distributed

    init_distributed({"suite": "all_to_all"}, timeout_s=20.0)
    try:
        x = torch.arange(4.0).reshape(4, 1) + 10 * rank
        sends = [[1, 3], [2, 2]][rank]
        try:
            ops.all_to_all(x, [[1, 2], [2, 2]][rank], sends)
            message = None
        except ValueError as exc:
            message = str(exc)
        good = ops.all_to_all(x, [[1, 2], [3, 2]][rank], sends)
        return message, good.flatten().tolist()
    finally:
        shutdown_distributed()


def test_all_to_all_whose_output_sizes_disagree_with_the_peers_is_rejected_on_every_rank():
    outcomes = run_on_ranks(all_to_all_with_splits, 2, timeout_s=90.0)
    for outcome in outcomes:
        assert outcome.ok, outcome.traceback
    messages = [o.value[0] for o in outcomes]
    for message in messages:
        assert message is not None and re.fullmatch(
            r"dsahal\.all_to_all: argument 'output_split_sizes' expected .+, got .+", message), message
        assert "send to rank 1, [3, 2], got [2, 2] on rank 1" in message
    assert outcomes[0].value[1] == [0.0, 10.0, 11.0] and outcomes[1].value[1] == [1.0, 2.0, 3.0, 12.0, 13.0]


def value_errors(*calls) -> list:
    """Each call's ValueError message, or None where it was accepted (run on a rank)."""
    messages = []
    for call in calls:
        try:
            call()
            messages.append(None)
        except ValueError as exc:
            messages.append(str(exc))
    return messages


def rejected_on_every_rank(on_rank, says: str) -> list:
    """Run ``on_rank`` on 2 gloo ranks; every message it returns (its value's first item) must start with
    ``says``, then name every rank's input and the rank that raised it."""
    outcomes = run_on_ranks(on_rank, 2, timeout_s=90.0)
    for rank, outcome in enumerate(outcomes):
        assert outcome.ok, outcome.traceback
        for message in outcome.value[0]:
            assert message is not None and message.startswith(says + ", got rank 0: "), message
            assert f"(this is rank {rank}; every rank raises this)" in message
    return outcomes


def all_gather_with_shapes(rank, world):
    """Rank 1 gathers one row more, then (a second call) another dtype: every rank must raise the same error
    (gloo aborted rank 0's process and handed rank 1 rows cut from the wrong sizes). A consistent call
    afterwards still gathers the right rows."""
    from dsahal.distributed import init_distributed, shutdown_distributed

    init_distributed({"suite": "all_gather"}, timeout_s=20.0)
    try:
        messages = value_errors(lambda: ops.all_gather(torch.randn(2 + rank, 3)),
                                lambda: ops.all_gather(torch.randn(2, 3, dtype=(torch.float32, torch.float64)[rank])))
        good = ops.all_gather(torch.full((2,), float(rank + 1)))
        return messages, good.tolist()
    finally:
        shutdown_distributed()


def test_all_gather_whose_inputs_differ_between_ranks_is_rejected_on_every_rank():
    outcomes = rejected_on_every_rank(all_gather_with_shapes,
                                      "dsahal.all_gather: argument 'x' expected the same shape and dtype on every rank")
    for outcome in outcomes:
        shape, dtype = outcome.value[0]
        assert "rank 0: (2, 3) float32, rank 1: (3, 3) float32" in shape
        assert "rank 0: (2, 3) float32, rank 1: (2, 3) float64" in dtype
        assert outcome.value[1] == [[1.0, 1.0], [2.0, 2.0]]


def topk_merge_with_rows(rank, world):
    """Rank 1 merges one row more, then (a second call) keeps one more: every rank must raise the same error
    (gloo aborted rank 0's process on the rows; on k each rank returned its own width, where every rank must
    receive the same result). A consistent call afterwards still merges."""
    from dsahal.distributed import init_distributed, shutdown_distributed

    init_distributed({"suite": "topk_merge"}, timeout_s=20.0)
    try:
        def merge(tokens, k):
            scores = torch.randn(tokens, 10, generator=torch.Generator().manual_seed(rank))
            return ops.topk_merge(scores, torch.full((tokens,), 10, dtype=I32), k)

        messages = value_errors(lambda: merge(3 + rank, 4), lambda: merge(3, 4 + rank))
        good = ops.topk_merge(torch.randn(3, 10, generator=torch.Generator().manual_seed(rank)),
                              torch.full((3,), 10, dtype=I32), 4)
        return messages, good.tolist()
    finally:
        shutdown_distributed()


def test_topk_merge_whose_ranks_disagree_on_rows_or_k_is_rejected_on_every_rank():
    outcomes = rejected_on_every_rank(
        topk_merge_with_rows, "dsahal.topk_merge: argument 'local_scores' expected the same [T, N] and k on every rank")
    for outcome in outcomes:
        rows, k = outcome.value[0]
        assert "rank 0: [T, N] = [3, 10], k = 4, rank 1: [T, N] = [4, 10], k = 4" in rows
        assert "rank 0: [T, N] = [3, 10], k = 4, rank 1: [T, N] = [3, 10], k = 5" in k
    assert outcomes[0].value[1] == outcomes[1].value[1] and len(outcomes[0].value[1]) == 3


def collectives_with_a_rank_failing_its_own_checks(rank, world):
    """Rank 1 alone passes an argument its own checks reject (topk_merge's lengths out of range, all_gather's x not a
    tensor, all_to_all's sizes not summing to its rows): it must still join the ranks' agreement exchange, so that
    rank 0 raises too instead of waiting there for it (until the group's timeout) or pairing it with rank 1's next
    collective. A consistent call afterwards still merges, gathers and exchanges the right rows."""
    from dsahal.distributed import init_distributed, shutdown_distributed

    init_distributed({"suite": "local_checks"}, timeout_s=20.0)
    try:
        scores = torch.randn(3, 10, generator=torch.Generator().manual_seed(rank))
        lengths = torch.full((3,), 10 + 5 * rank, dtype=I32)  # rank 1: 15 > N = 10
        x = torch.arange(4.0).reshape(4, 1) + 10 * rank
        messages = value_errors(lambda: ops.topk_merge(scores, lengths, 4))
        try:
            ops.all_gather([1.0, 2.0] if rank else torch.ones(2))
            messages.append(None)
        except (TypeError, ValueError) as exc:
            messages.append(str(exc))
        messages += value_errors(lambda: ops.all_to_all(x, [2, 2], [2, 2 + rank]))
        merged = ops.topk_merge(scores, torch.full((3,), 10, dtype=I32), 4)
        gathered = ops.all_gather(torch.full((2,), float(rank + 1)))
        exchanged = ops.all_to_all(x, [2, 2], [2, 2])
        return messages, merged.shape[0], gathered.tolist(), exchanged.flatten().tolist()
    finally:
        shutdown_distributed()


def test_a_rank_whose_own_checks_fail_takes_its_peers_with_it_instead_of_hanging_them():
    outcomes = run_on_ranks(collectives_with_a_rank_failing_its_own_checks, 2, timeout_s=90.0)
    for outcome in outcomes:
        assert outcome.ok, outcome.traceback
    (peer, merged0, gathered0, exchanged0), (own, merged1, gathered1, exchanged1) = (o.value for o in outcomes)
    for op, message in zip(("topk_merge", "all_gather", "all_to_all"), peer):
        assert message == (f"dsahal.{op}: the argument checks of this call failed on rank(s) [1] (each raised its "
                           "reason; this is rank 0, and every rank of the call raises)"), message
    for op, argument, message in zip(("topk_merge", "all_gather", "all_to_all"),
                                     ("local_lengths", "x", "input_split_sizes"), own):
        assert message is not None and message.startswith(f"dsahal.{op}: argument '{argument}' expected "), message
        assert message.endswith("(this is rank 1; every rank of the call raises: its argument checks failed on "
                                "rank(s) [1])"), message
    assert merged0 == merged1 == 3
    assert gathered0 == gathered1 == [[1.0, 1.0], [2.0, 2.0]]
    assert exchanged0 == [0.0, 1.0, 10.0, 11.0] and exchanged1 == [2.0, 3.0, 12.0, 13.0]


# ---------------------------------------------------------------------------- the valid call

@pytest.mark.parametrize("op", KDA_CALLS)
def test_a_float64_gate_is_valid_and_means_the_same_as_fp32(op):
    a = kda_args(lead=2 if op == "kda_decode" else 5)
    g64 = a["g"].double()
    pool64, pool32 = a["state_pool"].clone(), a["state_pool"].clone()
    call = KDA_CALLS[op]
    with_fp64 = call(**{**a, "g": g64, "state_pool": pool64})()
    with_fp32 = call(**{**a, "state_pool": pool32})()
    torch.testing.assert_close(with_fp64, with_fp32)
    torch.testing.assert_close(pool64, pool32)


def test_the_triton_kda_kernels_take_a_float64_gate_and_no_other_float64_input():
    """The op's gate may be any float dtype, used in fp32: the shared Triton routes take an fp64 one (their launchers
    hand the kernels its fp32 values, ``limits.kda_gate``) rather than leave the call to the float64 reference;
    q, k, v and beta stay 16/32-bit."""
    accept_any_device = lambda **tensors: limits.OK  # noqa: E731 - the CPU stands in for the GPU here
    a = kda_args()
    decode = (a["q"], a["k"], a["v"], a["g"], a["beta"], a["state_pool"], a["state_ids"], 1.0, True)
    assert limits.kda_decode(*decode, device_check=accept_any_device) == limits.OK
    assert limits.kda_decode(*decode[:3], a["g"].double(), *decode[4:], device_check=accept_any_device) == limits.OK
    ok, why = limits.kda_decode(a["q"].double(), *decode[1:], device_check=accept_any_device)
    assert not ok and "'q'" in why and "float64" in why
    ok, why = limits.kda_decode(*decode[:3], a["g"].to(I32), *decode[4:], device_check=accept_any_device)
    assert not ok and "'g'" in why and "int32" in why
    b = kda_args(lead=5)
    prefill = (b["q"], b["k"], b["v"], b["g"].double(), b["beta"], torch.tensor([0, 2, 5], dtype=I32),
               b["state_pool"], b["state_ids"], 1.0, True)
    assert limits.kda_prefill(*prefill, device_check=accept_any_device) == limits.OK
    g = b["g"].double()
    assert limits.kda_gate(g).dtype == torch.float32 and torch.equal(limits.kda_gate(g), g.float())
    assert limits.kda_gate(b["g"]) is b["g"]