"""cache_write on XLA tensors writes exactly the reference's bytes, in place, and nothing else."""
from __future__ import annotations

import pytest
import torch

from dsahal import ops
from dsahal.backends.tpu.support import INDEX_FORMATS, LATENT_FORMATS
from dsahal.formats import cache_format

from conftest import on_reference, on_tpu


def random_pages(num_blocks, block_tokens, token_bytes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (num_blocks, block_tokens, token_bytes), generator=gen, dtype=torch.int32).to(torch.uint8)


CLAIMED = [("latent", f) for f in sorted(LATENT_FORMATS)] + [("index", f) for f in sorted(INDEX_FORMATS)]


@pytest.mark.parametrize("kind,fmt", CLAIMED, ids=[f"{k}:{f}" for k, f in CLAIMED])
def test_cache_write_matches_the_reference_bytes_and_skips_minus_one(kind, fmt, xla):
    spec = cache_format(kind, fmt)
    scale = torch.tensor(0.02) if spec.needs_tensor_scale else None
    values = torch.randn(9, spec.dim) * 3
    slots = torch.tensor([4, -1, 0, 17, -1, 9, 23, 2, -1], dtype=torch.int32)
    before = random_pages(4, 6, spec.token_bytes)
    expected = before.clone()
    on_reference(ops.cache_write, values, slots, expected, kind=kind, fmt=fmt, scale=scale)
    pages = before.to(xla)
    on_tpu(ops.cache_write, values.to(xla), slots.to(xla), pages, kind=kind, fmt=fmt,
           scale=None if scale is None else scale.to(xla))
    assert torch.equal(pages.cpu(), expected)


def test_all_minus_one_slots_write_nothing(xla):
    before = random_pages(3, 4, 132, seed=1)
    pages = before.to(xla)
    slots = torch.full((5,), -1, dtype=torch.int32)
    on_tpu(ops.cache_write, torch.randn(5, 128).to(xla), slots.to(xla), pages, kind="index", fmt="fp8")
    assert torch.equal(pages.cpu(), before)


def test_cache_write_through_a_strided_page_view_updates_only_that_view(xla):
    # A packed pool row holds [latent page | index page]; the index pages are a strided view.
    pool = random_pages(4, 5, 1152 + 132, seed=2)
    expected_pool = pool.clone()
    values = torch.randn(6, 128)
    slots = torch.tensor([0, 7, -1, 19, 11, 3], dtype=torch.int32)
    on_reference(ops.cache_write, values, slots, expected_pool[:, :, 1152:], kind="index", fmt="fp8")
    pool_xla = pool.to(xla)
    view = pool_xla[:, :, 1152:]
    on_tpu(ops.cache_write, values.to(xla), slots.to(xla), view, kind="index", fmt="fp8")
    assert torch.equal(pool_xla.cpu(), expected_pool)
