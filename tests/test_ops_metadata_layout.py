"""The public ops hand every route its integer metadata with unit stride in the last dim (``core/ops/_layout.py``).

Kernels read slots, ids, positions, lengths, ``cu_seqlens`` and block tables with their last dim contiguous:
on the ``nvidia`` backend (Triton interpreter), ``cache_write`` with slots ``s[::2]`` wrote other rows of the
cache. Each case calls a public op with strided views of its metadata (every other element of a wider buffer,
whose other elements are wrong values) and checks, through a recording stand-in for the route, that the route
received unit-stride tensors with the same values, and that the result equals the contiguous call's.
"""
from __future__ import annotations

import pytest
import torch

from dsahal import ops
from dsahal.ops.catalog import SPECS
from dsahal.registry.state import active_table

I32 = torch.int32


def strided(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` as every other element of a wider last dim; the others hold -7 (an invalid id)."""
    wide = torch.full((*t.shape[:-1], 2 * t.shape[-1]), -7, dtype=t.dtype)
    wide[..., ::2] = t
    view = wide[..., ::2]
    assert view.stride(-1) == 2 and torch.equal(view, t)
    return view


def _pages(blocks, tokens, width):
    """Index-key records (random bytes below 120: finite e4m3 codes and scale bytes), the same every call."""
    return torch.randint(0, 120, (blocks, tokens, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def _latents(blocks, tokens):
    """bf16 latent records ``[blocks, tokens, 1152]``, the same every call."""
    values = torch.randn(blocks, tokens, 576, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    return values.view(torch.uint8)


def _indexer(meta):
    block_table, req_ids, positions = meta
    return ops.indexer_score(torch.randn(3, 2, 128, generator=torch.Generator().manual_seed(1)),
                             torch.ones(3, 2), _pages(2, 4, 132), block_table, req_ids, positions,
                             index_fmt="fp8", max_context=8)


def _dsa(meta):
    block_table, req_ids, positions = meta
    gen = torch.Generator().manual_seed(2)
    return ops.dsa_attention(torch.randn(3, 2, 128, generator=gen), torch.ones(3, 2), _pages(2, 4, 132),
                             torch.randn(3, 2, 576, generator=gen), _latents(2, 4), block_table, req_ids, positions, index_fmt="fp8", kv_fmt="bf16", kv_scale=None,
                             topk=4, max_context=8, softmax_scale=0.1)


def _kda_decode(meta):
    (state_ids,) = meta
    gen = torch.Generator().manual_seed(3)
    return ops.kda_decode(torch.randn(2, 2, 8, generator=gen), torch.randn(2, 2, 8, generator=gen),
                          torch.randn(2, 2, 4, generator=gen), -torch.rand(2, 2, 8, generator=gen),
                          torch.rand(2, 2, generator=gen), torch.ones(3, 2, 8, 4), state_ids)


def _kda_prefill(meta):
    cu_seqlens, state_ids = meta
    gen = torch.Generator().manual_seed(4)
    return ops.kda_prefill(torch.randn(5, 2, 8, generator=gen), torch.randn(5, 2, 8, generator=gen),
                           torch.randn(5, 2, 4, generator=gen), -torch.rand(5, 2, 8, generator=gen),
                           torch.rand(5, 2, generator=gen), cu_seqlens, torch.ones(3, 2, 8, 4), state_ids)


def _cache_write(meta):
    (slots,) = meta
    pages = torch.zeros(2, 4, 1152, dtype=torch.uint8)
    ops.cache_write(torch.randn(2, 576, generator=torch.Generator().manual_seed(5)), slots, pages, kind="latent",
                    fmt="bf16", scale=None)
    return pages


# (op, call, metadata (contiguous), the spec's names of the metadata arguments)
CASES = [
    ("indexer_score", _indexer, (torch.tensor([[0, 1]], dtype=I32), torch.zeros(3, dtype=I32),
                                 torch.tensor([0, 1, 7], dtype=I32)), ("block_table", "req_ids", "positions")),
    ("positions_to_slots", lambda m: ops.positions_to_slots(m[0], m[1], m[2], block_tokens=4),
     (torch.tensor([[0, 5], [1, 2]], dtype=I32), torch.tensor([0, 0], dtype=I32), torch.tensor([[1, 0]], dtype=I32)),
     ("positions", "req_ids", "block_table")),
    ("topk", lambda m: ops.topk(torch.randn(2, 10, generator=torch.Generator().manual_seed(6)), m[0], 3),
     (torch.tensor([10, 4], dtype=I32),), ("lengths",)),
    ("sparse_mla", lambda m: ops.sparse_mla(torch.randn(2, 3, 576, generator=torch.Generator().manual_seed(7)),
                                            _latents(2, 4), m[0], kv_fmt="bf16", softmax_scale=0.1,
                                            kv_scale=None),
     (torch.tensor([[0, 5], [-1, 7]], dtype=I32),), ("slots",)),
    ("cache_write", _cache_write, (torch.tensor([0, 3], dtype=I32),), ("slots",)),
    ("kda_decode", _kda_decode, (torch.tensor([0, 2], dtype=I32),), ("state_ids",)),
    ("kda_prefill", _kda_prefill, (torch.tensor([0, 2, 5], dtype=I32), torch.tensor([0, 2], dtype=I32)),
     ("cu_seqlens", "state_ids")),
    ("dsa_attention", _dsa, (torch.tensor([[0, 1]], dtype=I32), torch.zeros(3, dtype=I32),
                             torch.tensor([0, 1, 7], dtype=I32)), ("block_table", "req_ids", "positions")),
]


def _same(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


@pytest.mark.parametrize("op, call, meta, names", CASES, ids=[c[0] for c in CASES])
def test_routes_receive_unit_stride_metadata(monkeypatch, op, call, meta, names):
    table = active_table()
    route = table.dispatch[op]
    received = []

    def recording(*args):
        received.append({name: args[SPECS[op].params.index(name)] for name in names})
        return route(*args)

    want = call(meta)
    monkeypatch.setitem(table.dispatch, op, recording)
    got = call(tuple(strided(t) for t in meta))
    assert received, f"{op}: the route was not called"
    for name, value in received[-1].items():
        assert value.stride(-1) == 1, f"{op}: route got '{name}' with strides {value.stride()}"
        assert torch.equal(value, meta[names.index(name)]), f"{op}: '{name}' changed values"
    assert _same(got, want), f"{op}: the strided call's result differs from the contiguous call's"


def test_unit_stride_metadata_is_passed_through_without_a_copy():
    from dsahal.ops._layout import unit_last

    ids = torch.arange(6, dtype=I32)
    rows = torch.arange(12, dtype=I32).view(3, 4)[:, :2]  # a row stride of 4, unit last stride
    assert unit_last(ids) is ids and unit_last(rows) is rows
    assert unit_last(ids[::2]).is_contiguous() and unit_last(ids[:1]) is not None
