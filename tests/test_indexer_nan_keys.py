"""NaN in the index cache: a key whose MXFP4 scale byte is 255 (the OCP MX NaN scale) scores NaN where a token sees
it, in the float64 reference and in the NVIDIA indexer kernels alike.

No encoder writes that byte (a corrupt or foreign cache does); the reference decodes it to NaN and ``torch.relu``
keeps a NaN logit NaN, so the kernels' relu must too: PTX's plain ``max`` returns the other operand for a NaN one, so
the kernels ask for the NaN-keeping form (``FMNMX.NAN`` in the sm_90 compile, checked below on the SASS; the Triton
interpreter's ``maximum`` drops a NaN the same way without it). Under ``TRITON_INTERPRET=1`` in a child process: the
block-tile kernel's MXFP4 paths (word decode and byte path with FP8 queries, the byte path with fp32 ones) on a batch
with an unmapped block and causal bounds mid-tile, the other scores against the reference as the other tests judge
them. (A NaN e4m3 code in an FP8 key reaches the score through the FP8 MMA, which the interpreter does not emulate
for NaN: there only the relu is checked, on the SASS.)
"""
from __future__ import annotations

import json
import re

import pytest

from indexer_cases import paged_case
from interpreter_child import child_results, run_groups

TOL = 1e-5  # exact keys, fp32 accumulation (as tests/test_indexer_mxfp4_words.py)


def test_ue8m0_byte_255_decodes_to_nan_and_its_block_with_it():
    import torch

    from dsahal.formats import cache_format
    from dsahal.formats.numerics import ue8m0_decode

    got = ue8m0_decode(torch.tensor([0, 126, 127, 254, 255], dtype=torch.uint8))
    assert got[:4].tolist() == [2.0**-127, 0.5, 1.0, 2.0**127] and bool(torch.isnan(got[4]))
    spec = cache_format("index", "mxfp4")
    records = spec.pack(torch.randn(3, 128) + 1e-3)
    records[1, 64 + 2] = 255  # key 1's third 32-dim block
    values = spec.unpack(records)
    assert bool(torch.isnan(values[1, 64:96]).all())
    assert int(torch.isnan(values).sum()) == 32


def _nan_pages(torch, block_tokens):
    """``[8, block_tokens, 68]`` random MXFP4 records, a few keys' second block scale byte 255 (NaN)."""
    from dsahal.formats import cache_format

    spec = cache_format("index", "mxfp4")
    pages = spec.pack(torch.randn(8 * block_tokens, 128) + 1e-3).view(8, block_tokens, spec.token_bytes).clone()
    for block, key in ((3, 1), (1, block_tokens - 2), (6, block_tokens // 2)):
        pages[block, key, 64 + 1] = 255
    return pages


def _kernel_cases(results):
    import torch

    from dsahal.backends.triton_kernels import indexer_decode as d
    from dsahal.backends.triton_kernels.indexer import run_offsets
    from dsahal.reference.indexer import indexer_score as reference

    block_tokens = 16
    table, req, pos = paged_case(block_tokens)
    width = 4 * block_tokens - 3
    offsets = run_offsets(req)
    safe = torch.where(table >= 8, -1, table)
    w = torch.randn(8, 4)
    q32 = torch.randn(8, 4, 128) * 2
    q8 = q32.to(torch.float8_e4m3fn)
    pages = _nan_pages(torch, block_tokens)
    for mode, alu, query, dot in ((4, 28, q8, d.DOT_BF16), (4, 4, q8, d.DOT_BF16), (2, 4, q32, d.DOT_FP32)):
        want = reference(query.float(), w, pages, safe, req, pos, "mxfp4", width)
        out = torch.full((8, width), 7.0)
        got = d.launch(query, w, pages, table, req, pos, offsets, "mxfp4", width, out, dot=dot, block_n=block_tokens,
                       group=5, tiles=2, loop=1, mxfp4_mode=mode, alu=alu)
        name = f"m{mode}_alu{alu}"
        results[f"has_nan_{name}"] = bool(torch.isnan(want).any())
        results[f"nan_{name}"] = torch.equal(torch.isnan(got), torch.isnan(want))
        rest = torch.isfinite(want)
        results[f"mask_{name}"] = torch.equal(torch.isfinite(got), rest)
        a, b = got[rest].double(), want[rest].double()
        results[f"err_{name}"] = f"{float((a - b).norm() / b.norm().clamp_min(1e-30)):.3e}"


def _run_all() -> dict:
    import torch

    torch.manual_seed(0)
    return run_groups((_kernel_cases,))


@pytest.fixture(scope="module")
def interpreted():
    return child_results(__file__)


def test_the_block_tile_kernel_scores_nan_where_the_reference_does(interpreted):
    names = [k[4:] for k in interpreted if k.startswith("nan_")]
    assert len(names) == 3, sorted(interpreted)
    assert all(interpreted[f"has_nan_{n}"] for n in names)  # the case reaches a poisoned key
    assert all(interpreted[f"nan_{n}"] for n in names), sorted(n for n in names if not interpreted[f"nan_{n}"])
    assert all(interpreted[f"mask_{n}"] for n in names), sorted(n for n in names if not interpreted[f"mask_{n}"])
    worst = {n: interpreted[f"err_{n}"] for n in names if not float(interpreted[f"err_{n}"]) < TOL}
    assert not worst, worst


@pytest.mark.parametrize("name", [
    "indexer block tiles, fp8 keys, fp8 q, 32 heads, alu 5, 5-token segments",
    "indexer mxfp4 keys word decode, bf16 q, 32 heads, mxfp4_mode 2, alu 28, 5-token segments",
    "indexer fp8 keys, bf16 q, 32 heads",
    "indexer Gluon, fp8 keys, 32 heads, bf16 q, 2 token(s) a request, 4 stages, depth 2, hi and lo stacked",
    "indexer Gluon, fp8 keys, 32 heads, fp8 q, 5 token(s) a request, 4 stages, depth 1, 128 registers",
    "indexer Gluon, fp8 keys, 64 heads, bf16 q, 5 token(s) a request, 2 stages, depth 1, hi and lo stacked",
    "indexer Gluon, mxfp4 keys, fp8 q, 2 token(s) a request, 4 stages, register operands",
    "indexer Gluon folded, mxfp4 keys, bf16 q, 5 token(s) a request, 4 stages, register operands",
    "indexer Gluon, fp8 keys, 32 heads, fp8 q, 5 token(s) a request, 4 stages, depth 1, 128 registers, head sums as "
    "MMAs, fused group maxima",
])
def test_the_kernels_relu_keeps_a_nan_logit_on_hopper(name):
    """Every relu (a float max against zero) in the sm_90 compile is ``FMNMX.NAN``."""
    pytest.importorskip("triton")
    from dsahal.backends.nvidia import aot

    (variant,) = [v for v in aot.variants() if v.name.startswith(name) and ("fused" in v.name) == ("fused" in name)]
    result = aot.compile_variant(variant)
    if variant.gluon and result.error:  # (Triton 3.9's Gluon refuses the padded layout: the H200's 3.6 compiles it)
        from dsahal.backends.triton_kernels import indexer_gluon

        assert indexer_gluon.compile_failure(False), result.error  # the backend then keeps the tl kernel
        pytest.skip(f"this Triton's Gluon does not compile the kernel (the backend falls back): {result.error[:80]}")
    assert result.error == "", result.error
    maxes = re.findall(r"\b(FMNMX\S*)\s+[^;]*\bRZ\b", aot._cuobjdump(result.cubin, "-sass"))
    assert maxes and set(maxes) == {"FMNMX.NAN"}, sorted(set(maxes))


if __name__ == "__main__":
    # Child process: TRITON_INTERPRET=1 is already in the environment, before triton's import.
    print(json.dumps(_run_all()))
