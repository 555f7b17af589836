"""``python -m dsahal.backends.nvidia.aot``: the shared kernels compiled for sm_90 without a GPU."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from dsahal.backends.nvidia import aot  # noqa: E402


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


def test_the_old_module_paths_resolve_with_a_deprecation_warning():
    """``dsahal.bench.aot`` / ``dsahal.bench.tune`` moved into the NVIDIA backend: the core names them
    only as strings, and the old names still reach the moved functions."""
    import dsahal.bench.aot as old_aot
    import dsahal.bench.tune as old_tune

    with pytest.warns(DeprecationWarning, match="use dsahal.backends.nvidia.aot"):
        assert old_aot.variants is aot.variants
    with pytest.warns(DeprecationWarning, match="use dsahal.backends.nvidia.tune"):
        assert old_tune.main is importlib.import_module("dsahal.backends.nvidia.tune").main
    with pytest.raises(AttributeError, match="no_such_name"):
        old_aot.no_such_name


def test_python_m_on_the_old_path_runs_the_moved_tool():
    proc = subprocess.run([sys.executable, "-m", "dsahal.bench.aot", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m dsahal.backends.nvidia.aot")  # the moved tool's own parser
    assert "python -m dsahal.bench.aot is deprecated; use python -m dsahal.backends.nvidia.aot" in proc.stderr


def test_the_compile_is_told_what_a_launch_on_aligned_tensors_tells_triton():
    """Pointers and specialised strides are multiples of 16 at run time (allocator-aligned tensors); without
    that the compile models unaligned launches (the KDA kernel then showed 255 registers and spills that a
    serving launch does not have, against 178 and none with the facts: sixth session)."""
    from dsahal.backends.nvidia.aot import Variant, run_time_alignment
    from dsahal.backends.triton_kernels import kda

    variant = Variant("kda", kda.kda_recurrent_kernel, dict(BLOCK_K=128, BLOCK_V=64, VARLEN=False, L2NORM=True,
                                                             ZERO_PADDING_OUTPUT=True),
                      dict(q_ptr="bf16", k_ptr="bf16", v_ptr="bf16", g_ptr="fp32", beta_ptr="bf16",
                           out_ptr="bf16", state_ptr="fp32", ids_ptr="i32", cu_ptr="i32"), floats=("scale",),
                      divisible=("K",))
    names = kda.kda_recurrent_kernel.arg_names
    facts = {names[i]: attrs for (i,), attrs in run_time_alignment(variant).items()}
    assert set(facts) >= {"q_ptr", "state_ptr", "stride_qn", "stride_sp", "K"}
    assert not {"scale", "H", "V", "P", "BLOCK_K"} & set(facts)
    assert all(attrs == [["tt.divisibility", 16]] for attrs in facts.values())
