"""``python -m dsahal.bench.aot``: the shared kernels compiled for sm_90 without a GPU."""
from __future__ import annotations

import pytest

pytest.importorskip("triton")

from dsahal.bench import aot  # noqa: E402


def test_variants_cover_the_fast_and_the_exact_paths():
    names = [v.name for v in aot.variants()]
    assert any("indexer" in n and "exact" in n for n in names)
    assert any("sparse MLA" in n and "exact" in n for n in names)
    assert any(n.startswith("top-k") for n in names) and any(n.startswith("KDA") for n in names)
    for variant in aot.variants():  # every non-constexpr argument gets a type the compiler accepts
        assert set(variant.signature()) == set(variant.kernel.arg_names)


def test_a_variant_compiles_for_hopper_and_reports_its_resources():
    topk = next(v for v in aot.variants() if v.name == "top-k")
    result = aot.compile_variant(topk)
    assert result.error == "", result.error
    assert 0 < result.registers <= 255 and result.stack_bytes is not None and result.shared_bytes >= 0
