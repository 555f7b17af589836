"""Hypothesis strategies over each op's whole valid domain.

Every strategy draws a *case* (:mod:`dsahal.conformance.cases`, :mod:`dsahal.conformance.paged`):
small printable parameters from which the tensors are rebuilt with a seeded generator. Cases of
format-parametrized tests are drawn with ``fmt=None`` and bound to the test's format with
``bind``, so explicit ``@example`` cases work for every format. Format lists are read from
:mod:`dsahal.formats` when a test module is imported: a newly added format is covered with no
edit here.
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from dsahal import formats
from dsahal.conformance.cases import KdaCase, LseCase, MergeCase, SlotsCase, TopkCase
from dsahal.conformance.paged import LAYOUTS, REGIMES, CacheWriteCase, DsaCase, IndexerCase, SparseMlaCase

seeds = st.integers(0, 2**31 - 1)
index_dtypes = st.sampled_from(["int32", "int64"])
page_layouts = st.sampled_from(LAYOUTS)
# Top-k kernels work a row in tiles (backends/triton_kernels/topk.py: chunks of 1024 or 2048
# entries): rows wider than a tile now and then, so ties and the last partial tile span tiles.
TOPK_TILE = 1024
WIDE_ROWS = st.integers(TOPK_TILE + 1, 2 * TOPK_TILE + 100)
# KDA prefill kernels work in chunks (64 tokens in fla and the reference, 16 in smaller kernels):
# sequences of whole chunks end exactly on a chunk boundary, where the final state is stored.
KDA_CHUNK_LENGTHS = st.sampled_from([16, 32, 64, 128])
# lse_combine kernels often unroll a fixed number of partials (8): DCP 16, split-K over 8.
MANY_PARTIALS = st.sampled_from([9, 16])


def mostly(common, rare, rare_one_in: int = 6):
    """``common`` most of the time, ``rare`` (production-sized, expensive on the CPU reference)
    about once in ``rare_one_in`` draws."""
    return st.integers(0, rare_one_in - 1).flatmap(lambda x: rare if x == 0 else common)
block_tokens = st.sampled_from([1, 2, 3, 4, 16, 64])
MAX_QUERIES_PER_REQUEST = 8  # one decode token plus up to seven speculative drafts


def latent_format_names() -> list[str]:
    return sorted(formats.LATENT_FORMATS)


def index_format_names() -> list[str]:
    return sorted(formats.INDEX_FORMATS)


def all_format_ids() -> list[str]:
    """``"latent:<name>"`` and ``"index:<name>"`` for every registered format."""
    return [f"latent:{n}" for n in latent_format_names()] + [f"index:{n}" for n in index_format_names()]


def bind(case, fmt_id: str):
    """Bind a format-free case to the test's format id (``"latent:fp8"``, ``"latent:bf16+index:fp8"``)."""
    if isinstance(case, CacheWriteCase):
        kind, name = fmt_id.split(":")
        return case.replace(kind=kind, fmt=name)
    if isinstance(case, DsaCase):
        latent, index = fmt_id.split("+")
        return case.replace(latent_fmt=latent.split(":")[1], index_fmt=index.split(":")[1])
    return case.replace(fmt=fmt_id.split(":")[1])


@st.composite
def length_around(draw, k: int, width: int) -> int:
    """A length below, at or above ``k`` (within ``[0, width]``)."""
    where = draw(st.sampled_from(["below", "at", "above"]))
    if where == "below" or k > width:
        return draw(st.integers(0, min(k - 1, width)))
    if where == "at":
        return k
    return draw(st.integers(k, width))


@st.composite
def topk_cases(draw, max_rows: int = 6, max_width: int = 48) -> TopkCase:
    rows = draw(st.integers(1, max_rows))
    width = draw(mostly(st.integers(1, max_width), WIDE_ROWS, 5))
    k = draw(st.integers(1, width + 4))
    lengths = tuple(draw(st.lists(length_around(k, width), min_size=rows, max_size=rows)))
    inf_rows = tuple(sorted(draw(st.sets(st.integers(0, rows - 1), max_size=max(0, rows - 1)))))
    return TopkCase(rows=rows, width=width, k=k, lengths=lengths,
                    mode=draw(st.sampled_from(["continuous", "palette", "straddle", "equal"])),
                    neg_inf_fraction=draw(st.sampled_from([0.0, 0.0, 0.2, 0.7])), inf_rows=inf_rows,
                    noncontiguous=draw(st.booleans()), seed=draw(seeds), index_dtype=draw(index_dtypes))


@st.composite
def merge_cases(draw, worlds=(2, 4), max_k: int = 24, max_width: int = 64) -> MergeCase:
    """``max_width`` is the global context; for a rank to own more winners than the ~1.5k/W it
    sends (the resend path) at large W, it must be around ``W * k`` or wider."""
    world = draw(st.sampled_from(worlds))
    rows = draw(st.integers(1, 4))
    k = draw(st.integers(1, max_k))
    width = draw(st.integers(1, max_width))
    lengths = tuple(draw(st.lists(length_around(k, width), min_size=rows, max_size=rows)))
    return MergeCase(world=world, rows=rows, k=k, lengths=lengths,
                     mode=draw(st.sampled_from(["continuous", "palette", "straddle"])),
                     neg_inf_fraction=draw(st.sampled_from([0.0, 0.0, 0.3])),
                     concentrated=draw(st.sampled_from([True, True, False])),
                     hot_rank=draw(st.integers(0, world - 1)), seed=draw(seeds))


@st.composite
def slots_cases(draw) -> SlotsCase:
    return SlotsCase(rows=draw(st.integers(1, 8)), cols=draw(st.integers(1, 40)), requests=draw(st.integers(1, 4)),
                     max_blocks=draw(st.integers(1, 8)), block_tokens=draw(block_tokens),
                     num_blocks=draw(st.integers(1, 32)), padding_fraction=draw(st.sampled_from([0.0, 0.3, 1.0])),
                     unmapped_fraction=draw(st.sampled_from([0.0, 0.3])), seed=draw(seeds),
                     index_dtype=draw(index_dtypes))


@st.composite
def lse_cases(draw) -> LseCase:
    rows = draw(st.integers(1, 6))
    all_inf = tuple(sorted(draw(st.sets(st.integers(0, rows - 1), max_size=rows))))
    return LseCase(parts=draw(mostly(st.integers(1, 8), MANY_PARTIALS, 3)), rows=rows, heads=draw(st.sampled_from([1, 2, 16, 128])),
                   dim=draw(st.sampled_from([1, 8, 64, 512])), dtype=draw(st.sampled_from(["float32", "bfloat16",
                                                                                          "float16"])),
                   lse_offset=draw(st.sampled_from([0.0, 5.0, -30.0, 80.0, 1000.0])),
                   spread=draw(st.sampled_from([0.1, 2.0, 30.0])),
                   neg_inf_fraction=draw(st.sampled_from([0.0, 0.3, 0.8])), all_inf_rows=all_inf, seed=draw(seeds),
                   padded=draw(st.booleans()))


@st.composite
def kda_cases(draw, min_sequences: int = 1, max_len: int = 24) -> KdaCase:
    count = draw(st.integers(min_sequences, 3))
    kind = draw(st.integers(0, 9))  # now and then sequences crossing 64-token chunks or ending on one
    lengths = st.integers(65, 80) if kind == 0 else KDA_CHUNK_LENGTHS if kind == 1 else st.integers(0, max_len)
    seqlens = tuple(draw(st.lists(lengths, min_size=count, max_size=count)))
    # now and then a dim that is not a power of two (kernels pad and mask it)
    dims = mostly(st.sampled_from([16, 32, 64, 128]), st.sampled_from([24, 48, 96]), 5)
    return KdaCase(seqlens=seqlens, heads=draw(st.integers(1, 3)), key_dim=draw(dims), value_dim=draw(dims),
                   dtype=draw(st.sampled_from(["float32", "bfloat16"])), use_qk_l2norm=draw(st.booleans()),
                   scale=draw(st.sampled_from([None, 0.5])), decay=draw(st.sampled_from(["none", "mild", "strong"])),
                   padded=tuple(draw(st.lists(st.integers(0, 4).map(lambda x: x == 0), min_size=count,
                                              max_size=count))),
                   spare_states=draw(st.integers(0, 2)), seed=draw(seeds), index_dtype=draw(index_dtypes),
                   pool_layout=draw(st.sampled_from(["dense", "packed"])), fused=draw(st.booleans()),
                   # g: any float dtype, used in fp32 (the model's is fp32; bf16 gates are common elsewhere)
                   gate_dtype=draw(mostly(st.just("float32"), st.sampled_from(["bfloat16", "float16", "float64"]),
                                          3)))


@st.composite
def cache_write_cases(draw) -> CacheWriteCase:
    bt = draw(block_tokens)
    num_blocks = draw(st.integers(1, max(1, 64 // bt)))
    tokens = draw(st.integers(1, min(12, num_blocks * bt)))
    return CacheWriteCase(kind=None, fmt=None, tokens=tokens, num_blocks=num_blocks, block_tokens=bt,
                          skip_fraction=draw(st.sampled_from([0.0, 0.0, 0.3])),
                          dtype=draw(st.sampled_from(["float32", "bfloat16", "float16"])),
                          regime=draw(st.sampled_from(REGIMES)), lead=draw(st.sampled_from([0, 3, 16])),
                          trail=draw(st.sampled_from([0, 5])), guard_blocks=draw(st.integers(0, 2)),
                          seed=draw(seeds), layout=draw(page_layouts), index_dtype=draw(index_dtypes))


@st.composite
def requests(draw, max_requests: int = 3, max_length: int = 160, around: int | None = None) -> tuple:
    """``((context_length, query_tokens), ...)``; lengths straddle ``around`` when given."""
    count = draw(st.integers(1, max_requests))
    result = []
    for _ in range(count):
        length = draw(length_around(around, max_length)) if around else draw(st.integers(1, max_length))
        length = max(1, length)
        result.append((length, draw(st.integers(1, min(MAX_QUERIES_PER_REQUEST, length)))))
    return tuple(result)


@st.composite
def indexer_cases(draw) -> IndexerCase:
    # the model's 32 and 64 index heads, and TP slices of them (16, 24 = 3/4 of 32: padded to a power of two)
    heads = draw(mostly(st.sampled_from([1, 2, 4]), st.sampled_from([16, 24, 32, 32, 64]), 3))
    return IndexerCase(fmt=None, requests=draw(requests()), heads=heads,
                       q_dtype=draw(st.sampled_from(["bfloat16", "float32", "float8_e4m3fn"])),
                       block_tokens=draw(block_tokens), spare_blocks=draw(st.integers(0, 3)),
                       hole=draw(st.booleans()), width_delta=draw(st.sampled_from([0, 0, 3, -2])),
                       regime=draw(st.sampled_from(REGIMES)), lead=draw(st.sampled_from([0, 4])),
                       noncontiguous_q=draw(st.booleans()), seed=draw(seeds), layout=draw(page_layouts),
                       index_dtype=draw(index_dtypes), fused_q=draw(st.booleans()))


@st.composite
def sparse_mla_cases(draw, min_rows: int = 1, max_topk: int = 48) -> SparseMlaCase:
    rows = draw(st.integers(min_rows, 5))
    topk = draw(mostly(st.integers(1, max_topk), st.sampled_from([64, 128, 256, 2048])))
    bt = draw(block_tokens)
    factor = draw(st.sampled_from([0.5, 1.0, 2.0]))
    num_blocks = max(1, math.ceil(topk * factor / bt))
    empty = tuple(sorted(draw(st.sets(st.integers(0, rows - 1), max_size=1))))
    # TP slices of 128 heads (12 and 16 at TP 8-10, 32 at TP 4) and head counts a route pads (20, 48, 96)
    heads = draw(mostly(st.sampled_from([1, 2, 3, 12, 16]), st.sampled_from([20, 32, 48, 64, 64, 96, 128, 128])))
    return SparseMlaCase(fmt=None, rows=rows, heads=heads,
                         topk=topk,
                         num_blocks=num_blocks, block_tokens=bt,
                         minus_one_fraction=draw(st.sampled_from([0.0, 0.2, 0.6])), empty_rows=empty,
                         duplicates=draw(st.booleans()), q_dtype=draw(st.sampled_from(["bfloat16", "float32",
                                                                                        "float16"])),
                         softmax_scale=draw(st.sampled_from([192 ** -0.5, 576 ** -0.5, 0.3])),
                         regime=draw(st.sampled_from(REGIMES)), lead=draw(st.sampled_from([0, 8])), seed=draw(seeds),
                         layout=draw(page_layouts), index_dtype=draw(index_dtypes), fused_q=draw(st.booleans()))


@st.composite
def dsa_cases(draw) -> DsaCase:
    topk = draw(st.sampled_from([1, 4, 16, 64]))
    return DsaCase(latent_fmt=None, index_fmt=None, requests=draw(requests(max_length=96, around=topk)),
                   index_heads=draw(st.sampled_from([1, 4, 24, 32])), heads=draw(st.sampled_from([1, 4, 12, 16])),
                   topk=topk, block_tokens=draw(st.sampled_from([1, 4, 16, 64])),
                   q_dtype=draw(st.sampled_from(["bfloat16", "float32"])), seed=draw(seeds),
                   layout=draw(page_layouts))


@st.composite
def collective_cases(draw, worlds=(2, 4)) -> "CollectiveCase":
    from dsahal.conformance.cases import CollectiveCase

    world = draw(st.sampled_from(worlds))
    uneven = draw(st.booleans())
    splits = None
    if uneven:
        splits = tuple(tuple(draw(st.lists(st.integers(0, 3), min_size=world, max_size=world)))
                       for _ in range(world))
    return CollectiveCase(world=world, rows=draw(st.integers(0, 3)), tail=tuple(draw(st.lists(st.integers(1, 4),
                                                                                             max_size=2))),
                          dtype=draw(st.sampled_from(["float32", "bfloat16", "float16"])), splits=splits,
                          seed=draw(seeds))
