"""The Triton compile budget (``DSAHAL_TRITON_COMPILE_BUDGET``): which calls keep the specialised kernel,
which go to the generic twin, and that nothing is installed without the variable. No GPU: the two
kernels are replaced by recorders after the wrapper is built (the twin is still built from the real
source, which compiles nothing until launched)."""
import os

import pytest
import torch
import triton
import triton.language as tl

from dsahal.backends.triton_kernels import compile_budget
from dsahal.backends.triton_kernels.compile_budget import BudgetedKernel, budget_from_env
from dsahal.kernel_launch import LaunchedKernel, launched_kernels


def _take_budget_wrappers_off():
    import importlib

    for key, wrapper in compile_budget._installed.items():
        module, name = key.split(":")
        setattr(importlib.import_module(module), name, wrapper.kernel)
    compile_budget._installed.clear()
    # a kernel module imported while wrappers were installed took another module's wrapped kernel by name
    # (topk_groups imports two of topk_bound's): unwrap those too
    for module in compile_budget.kernel_modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, BudgetedKernel):
                setattr(module, name, value.kernel)


@pytest.fixture
def plain_kernels():
    """Each kernel behind its launch cache only, before and after the test: an earlier test of the same process
    (a backend built with a compile budget: the conformance suite run in-process) may have installed wrappers,
    and later tests expect none."""
    _take_budget_wrappers_off()
    yield
    _take_budget_wrappers_off()


@triton.jit(do_not_specialize=("n",))
def copy_kernel(src, dst, stride, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs * stride, tl.load(src + offs * stride, mask=offs < n), mask=offs < n)


class Recorder:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def budgeted(budget):
    wrapper = BudgetedKernel(copy_kernel, budget)
    assert wrapper.twin is not copy_kernel and wrapper.twin.fn is copy_kernel.fn
    twin_params = {p.name: p for p in wrapper.twin.params}
    assert twin_params["stride"].do_not_specialize and not twin_params["BLOCK"].do_not_specialize
    wrapper.kernel, wrapper.twin = Recorder(), Recorder()
    return wrapper


def offset_view(base: torch.Tensor, offset: int) -> torch.Tensor:
    return base[offset:]


def test_patterns_beyond_the_budget_go_to_the_twin_and_keep_their_choice():
    wrapper = budgeted(2)
    base = torch.zeros(64, dtype=torch.uint8)
    aligned, odd = offset_view(base, 0), offset_view(base, 3)
    launches = [(aligned, aligned, 16), (odd, aligned, 16), (aligned, aligned, 5), (aligned, aligned, 16),
                (odd, aligned, 5)]
    for src, dst, stride in launches:
        wrapper[(1,)](src, dst, stride, 7, BLOCK=16)
    # patterns 1 and 2 specialised, the third new pattern and the fifth go to the twin, the repeat stays
    assert len(wrapper.kernel.calls) == 3 and len(wrapper.twin.calls) == 2
    assert [c[1][2] for c in wrapper.twin.calls] == [5, 5]
    # a repeat of a twin pattern stays on the twin; `n` is do_not_specialize: its value is no pattern
    wrapper[(1,)](aligned, aligned, 5, 1, BLOCK=16)
    assert len(wrapper.twin.calls) == 3
    assert wrapper.stats() == {"specialised_patterns": 2, "generic_calls": 3, "cache_twin_calls": 0}


def test_each_constexpr_configuration_has_its_own_budget():
    wrapper = budgeted(1)
    base = torch.zeros(64, dtype=torch.uint8)
    wrapper[(1,)](base, base, 16, 4, BLOCK=16)
    wrapper[(1,)](base, base, 16, 4, BLOCK=32)  # new configuration: compiled specialised
    wrapper[(1,)](base, base, 5, 4, BLOCK=32)  # second pattern of that configuration: the twin
    wrapper[(1,)](base, base, 16, 4, BLOCK=16, num_warps=8)  # launch options are configuration too
    assert len(wrapper.kernel.calls) == 3 and len(wrapper.twin.calls) == 1


def test_budget_from_the_environment(monkeypatch):
    monkeypatch.delenv(compile_budget.ENV, raising=False)
    assert budget_from_env() is None
    for text, expected in (("", None), ("0", None), ("3", 3), (" 8 ", 8)):
        monkeypatch.setenv(compile_budget.ENV, text)
        assert budget_from_env() == expected
    for bad in ("x", "-1", "1.5"):
        monkeypatch.setenv(compile_budget.ENV, bad)
        with pytest.raises(ValueError, match=compile_budget.ENV):
            budget_from_env()


def test_no_budget_wrapper_without_a_budget_and_nothing_under_the_interpreter(monkeypatch, plain_kernels):
    from dsahal.backends.triton_kernels import sparse_mla

    monkeypatch.delenv(compile_budget.ENV, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    before = sparse_mla.sparse_mla_kernel
    compile_budget.install(4)
    assert sparse_mla.sparse_mla_kernel is before
    monkeypatch.delenv("TRITON_INTERPRET")
    compile_budget.install()
    # only the launch cache's wrapper, put there when the module was imported (every launch goes through it)
    assert sparse_mla.sparse_mla_kernel is before and isinstance(before, LaunchedKernel)


def test_install_wraps_the_launched_kernels_only(monkeypatch, plain_kernels):
    """Every module-level ``*_kernel`` is wrapped (and launching code finds the wrapper by its global
    name); device helpers are left alone, since kernels call them while compiling."""
    from triton.runtime.jit import JITFunction

    from dsahal.backends.triton_kernels import indexer, sparse_mla

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    wrapped = compile_budget.install(4)
    assert isinstance(sparse_mla.sparse_mla_kernel, BudgetedKernel)
    assert isinstance(indexer.indexer_score_kernel, BudgetedKernel)
    assert f"{sparse_mla.__name__}:sparse_mla_kernel" in wrapped
    assert isinstance(indexer._score_tile, JITFunction)  # a device helper
    assert compile_budget.install(4).keys() == wrapped.keys()  # idempotent
    # the Gluon kernel keeps its own launch: its layouts are written out, and a plain triton.jit twin of its source
    # would not compile (the H200 conformance run of 9049380 failed so)
    from dsahal.backends.triton_kernels import sparse_mla_gluon

    assert not isinstance(sparse_mla_gluon.sparse_mla_gluon_kernel, BudgetedKernel)
    assert f"{sparse_mla_gluon.__name__}:sparse_mla_gluon_kernel" not in wrapped


def test_a_budget_of_zero_sends_every_call_to_the_twin_and_none_passes_through():
    wrapper = budgeted(0)
    base = torch.zeros(64, dtype=torch.uint8)
    for stride in (16, 5, 16):
        wrapper[(1,)](base, base, stride, 4, BLOCK=16)
    assert len(wrapper.kernel.calls) == 0 and len(wrapper.twin.calls) == 3
    wrapper.budget = None  # a registry rebuilt outside batch-invariant mode, no budget asked
    wrapper[(1,)](base[3:], base, 5, 4, BLOCK=16)
    assert len(wrapper.kernel.calls) == 1


def test_batch_invariant_mode_installs_alignment_free_launches(monkeypatch, plain_kernels):
    from dsahal.backends.triton_kernels import sparse_mla

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(compile_budget.ENV, raising=False)
    compile_budget.install(invariant=True)
    assert isinstance(sparse_mla.sparse_mla_kernel, BudgetedKernel) and sparse_mla.sparse_mla_kernel.budget == 0
    compile_budget.install()  # default mode again, no budget asked: the wrappers pass calls through
    assert sparse_mla.sparse_mla_kernel.budget is None


def test_a_plugin_that_does_not_name_the_mode_keeps_batch_invariant_launches(monkeypatch, plain_kernels):
    """Every plugin's declaration installs the budget; the mode is the process's, so a declaration that does
    not pass it (the PPU plugin's, built after nvidia's in one registry) must not reset the budget of 0 to the
    suite's 4 (seen on the H200: kda_decode rows depended on the batch again)."""
    from dsahal.backends.triton_kernels import kda

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(compile_budget.ENV, "4")
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "1")
    compile_budget.install(invariant=True)
    compile_budget.install()  # another plugin's declaration, mode not named
    assert isinstance(kda.kda_decode_step_kernel, BudgetedKernel)
    assert all(w.budget == 0 for w in compile_budget._installed.values())
    monkeypatch.setenv("DSAHAL_BATCH_INVARIANT", "0")
    compile_budget.install()  # default mode: the suite's budget again
    assert all(w.budget == 4 for w in compile_budget._installed.values())


def cache_budgeted(budget, launcher_aligned=()):
    """``copy_kernel`` with ``src`` and ``stride`` named as its cache's arguments."""
    wrapper = BudgetedKernel(copy_kernel, budget, ("src", "stride"), launcher_aligned)
    params = {p.name: p for p in wrapper.cache_twin.params}
    # the cache twin: no facts about dst (a batch's own tensor) unless its launcher aligns it, the cache's kept;
    # `n` stays unspecialised
    assert params["dst"].do_not_specialize == ("dst" not in launcher_aligned) and params["n"].do_not_specialize
    assert not params["src"].do_not_specialize and not params["stride"].do_not_specialize
    assert {p.name for p in wrapper.twin.params if p.do_not_specialize} >= {"src", "dst", "stride", "n"}
    wrapper.kernel, wrapper.twin, wrapper.cache_twin = Recorder(), Recorder(), Recorder()
    return wrapper


def test_batch_invariant_mode_keeps_the_caches_facts_whatever_the_batchs_tensors():
    wrapper = cache_budgeted(0)
    base = torch.zeros(64, dtype=torch.uint8)
    aligned, odd = offset_view(base, 0), offset_view(base, 3)
    for dst in (aligned, odd):  # the batch's tensor at any offset: the cache decides
        wrapper[(1,)](aligned, dst, 16, 7, BLOCK=16)
        wrapper[(1,)](aligned, dst, 32, 7, BLOCK=16)
    assert len(wrapper.cache_twin.calls) == 4 and not wrapper.twin.calls and not wrapper.kernel.calls
    # a cache unaligned or with strides not multiples of 16 (fp8_ds_mla's 656-byte records: 328 / 164-element
    # strides in the 16- and 32-bit views) keeps its own facts too: the cache twin, specialised on them at run time
    for src, stride in ((odd, 16), (aligned, 5), (aligned, 1)):
        wrapper[(1,)](src, aligned, stride, 7, BLOCK=16)
    assert len(wrapper.cache_twin.calls) == 7 and not wrapper.twin.calls
    assert wrapper.stats() == {"specialised_patterns": 0, "generic_calls": 0, "cache_twin_calls": 7}


def test_batch_invariant_mode_bounds_the_cache_patterns_and_decides_each_once(monkeypatch):
    """Each configuration compiles the cache twin for INVARIANT_CACHE_PATTERNS cache patterns; a cache beyond them runs
    the fully generic twin, and keeps that choice whatever the batch (so a row's bits still depend on the cache
    alone)."""
    monkeypatch.setattr(compile_budget, "INVARIANT_CACHE_PATTERNS", 2)
    wrapper = cache_budgeted(0)
    base = torch.zeros(64, dtype=torch.uint8)
    for stride in (16, 5, 1, 16, 5):  # three cache patterns: (16-multiple), (neither), (== 1)
        for dst in (base, base[3:]):
            wrapper[(1,)](base, dst, stride, 7, BLOCK=16)
    assert len(wrapper.cache_twin.calls) == 8 and len(wrapper.twin.calls) == 2
    assert all(call[1][2] == 1 for call in wrapper.twin.calls)  # the third pattern, both batches
    wrapper[(1,)](base, base, 32, 7, BLOCK=32)  # another configuration has its own count
    assert len(wrapper.cache_twin.calls) == 9


def test_the_launcher_aligned_arguments_are_kept_and_checked():
    """Arguments a launcher aligns on every call (LAUNCHER_ALIGNED_ARGS) keep their facts in the cache twin; a call
    that breaks the promise is a dsahal bug: it raises, naming the kernel and the argument."""
    wrapper = cache_budgeted(0, launcher_aligned=("dst",))
    base = torch.zeros(64, dtype=torch.uint8)
    wrapper[(1,)](base, base[16:], 16, 7, BLOCK=16)
    assert len(wrapper.cache_twin.calls) == 1
    with pytest.raises(RuntimeError, match=r"copy_kernel's launcher promises dst 16-byte aligned .* a dsahal bug"):
        wrapper[(1,)](base, base[3:], 16, 7, BLOCK=16)
    with pytest.raises(ValueError, match=r"launcher-aligned arguments \['BLOCK'\] are not run-time parameters"):
        BudgetedKernel(copy_kernel, 0, ("src",), ("BLOCK",))


def test_a_budget_beyond_zero_keeps_the_fully_generic_twin_for_the_patterns_it_does_not_keep():
    """Only batch-invariant mode takes the cache twin: with the suite's budget a new cache pattern would compile
    another twin, which the budget is there to prevent."""
    wrapper = cache_budgeted(1)
    base = torch.zeros(64, dtype=torch.uint8)
    wrapper[(1,)](base, base, 16, 7, BLOCK=16)
    wrapper[(1,)](base, base[3:], 16, 7, BLOCK=16)
    assert len(wrapper.kernel.calls) == 1 and len(wrapper.twin.calls) == 1 and not wrapper.cache_twin.calls


def test_cache_arguments_must_be_run_time_parameters():
    with pytest.raises(ValueError, match=r"cache arguments \['BLOCK'\] are not run-time parameters of copy_kernel"):
        BudgetedKernel(copy_kernel, 0, ("src", "BLOCK"))
    # one the kernel itself leaves unspecialised stays so (no cache twin when none is left)
    assert BudgetedKernel(copy_kernel, 0, ("n",)).cache_twin is None


def test_the_kernels_name_their_caches_arguments(monkeypatch, plain_kernels):
    """The sparse-MLA and indexer kernels' pages and page strides: every name a parameter of its kernel, installed
    with the budget's wrappers."""
    from dsahal.backends.triton_kernels import (indexer, indexer_decode, kda, kda_chunk, lse_combine, sparse_mla,
                                                sparse_mla_small_heads, sparse_mla_small_heads_raw, topk_bound,
                                                topk_groups)

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    compile_budget.install(invariant=True)
    for module in (sparse_mla, sparse_mla_small_heads, sparse_mla_small_heads_raw, indexer, indexer_decode, kda,
                   kda_chunk, lse_combine, topk_bound, topk_groups):
        for name, args in module.LAUNCHER_ALIGNED_ARGS.items():
            wrapper = getattr(module, name)
            assert isinstance(wrapper, BudgetedKernel) and wrapper.cache_twin is not None
            assert set(wrapper.launcher_aligned) == set(args)
    # a kernel launched by another module (topk_groups launches two of topk_bound's) keeps its own module's
    for name in ("bound_threshold_kernel", "bound_finish_kernel"):
        wrapper = getattr(topk_groups, name)
        assert isinstance(wrapper, BudgetedKernel)
        assert set(wrapper.launcher_aligned) == set(topk_bound.LAUNCHER_ALIGNED_ARGS[name])
        assert set(wrapper.cache_args) == set(topk_bound.CACHE_ARGS.get(name, ()))
    for module in (kda, kda_chunk):  # the state pool and its dims (and pass B's output, shaped by them)
        for name, args in module.CACHE_ARGS.items():
            wrapper = getattr(module, name)
            assert set(wrapper.cache_args) == set(args) and {"K", "V"} <= set(args)
    for module in (sparse_mla, sparse_mla_small_heads, sparse_mla_small_heads_raw, indexer, indexer_decode):
        for name, args in module.CACHE_ARGS.items():
            wrapper = getattr(module, name)
            assert isinstance(wrapper, BudgetedKernel) and wrapper.cache_twin is not None
            assert set(wrapper.cache_args) == set(args) and all(a.startswith(("pages_", "s8_", "s16_", "s32_"))
                                                               for a in args)


def test_the_sparse_mla_launchers_align_the_queries():
    """``aligned_rows`` (the sparse-MLA launchers' queries): queries already 16-byte aligned with strides multiples of 16 pass through (no copy);
    any other start or stride (a slice of a fused projection) is copied contiguous: the same values, aligned."""
    from dsahal.backends.triton_kernels.alignment import aligned_rows

    q = torch.randn(3, 4, 576)
    assert aligned_rows(q) is q
    wide = torch.randn(3, 4, 640)
    assert aligned_rows(wide[:, :, 64:]).data_ptr() == wide[:, :, 64:].data_ptr()  # 256 bytes in, strides 2560 / 640
    shifted = torch.randn(3 * 4 * 576 + 1)[1:].view(3, 4, 576)  # 4 bytes in
    for view in (wide[:, :, 1:577], torch.randn(3, 4, 577)[:, :, :576], shifted):
        out = aligned_rows(view)
        assert out.data_ptr() % 16 == 0 and out.stride(0) % 16 == 0 and out.stride(1) % 16 == 0
        assert out.stride(-1) == 1 and torch.equal(out, view)


def test_every_launcher_keeps_its_alignment_promise_in_batch_invariant_mode(monkeypatch, plain_kernels):
    """Batch-invariant mode's wrappers (budget 0) around every kernel that declares LAUNCHER_ALIGNED_ARGS, with the
    compiles replaced by recorders: the NVIDIA backend's launchers, called with tensors at odd offsets and strides
    (slices of wider buffers, 4 heads, odd widths), must hand each kernel what it promised (a broken promise raises)
    and every call must take the twin that keeps the declared facts."""
    import importlib

    from dsahal.backends.nvidia import config
    from dsahal.backends.nvidia import ops
    from dsahal.backends.triton_kernels import segments
    from dsahal.formats import index_format, latent_format

    monkeypatch.setattr(config, "batch_invariant", lambda: True)
    for fn in config._CACHED:
        fn.cache_clear()
    wrappers = {}
    modules = ("sparse_mla", "sparse_mla_small_heads", "sparse_mla_small_heads_raw", "indexer", "indexer_decode", "kda",
               "kda_chunk", "lse_combine", "topk_bound", "topk_groups", "topk_registers")
    for module_name in modules:  # (all imported before any is wrapped: topk_groups imports topk_bound's by name)
        importlib.import_module(f"dsahal.backends.triton_kernels.{module_name}")
    for module_name in modules:  # as install wraps them: every launched kernel, its defining module's declarations
        module = importlib.import_module(f"dsahal.backends.triton_kernels.{module_name}")
        for name, kernel in launched_kernels(module).items():
            cache, aligned = compile_budget.declarations(kernel)
            if not aligned:
                continue
            wrapper = BudgetedKernel(kernel, 0, cache, aligned)
            wrapper.kernel, wrapper.twin, wrapper.cache_twin = Recorder(), Recorder(), Recorder()
            monkeypatch.setattr(module, name, wrapper)
            wrappers[f"{module_name}:{name}"] = wrapper
    monkeypatch.setattr(segments, "_plan_kernel", Recorder())  # (the segment plan: no declarations)
    try:
        gen = torch.Generator().manual_seed(3)

        def odd(*shape, dtype=torch.float32):
            """A tensor of ``shape`` one element into a buffer whose rows are one element wider."""
            wide = torch.randn(*shape[:-1], shape[-1] + 1, generator=gen).to(dtype)
            return wide[..., 1:]

        tokens = 5
        for fmt, heads in (("fp8_ds_mla", 4), ("fp8_ds_mla", 16), ("nvfp4", 16), ("fp8_ds_mla", 128)):
            pages = torch.zeros(3, 64, latent_format(fmt).token_bytes, dtype=torch.uint8)
            q = odd(tokens, heads, 576, dtype=torch.bfloat16)
            slots = torch.zeros(tokens, 2048, dtype=torch.int32)
            ops.sparse_mla(q, pages, slots, fmt, None, 0.1)
            if heads <= 16:
                ops.sparse_mla_small_heads(q, pages, slots, fmt, None, 0.1)
        table = torch.zeros(2, 4, dtype=torch.int32)
        req, pos = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32), torch.arange(tokens, dtype=torch.int32)
        for fmt, q_dtype in (("fp8", torch.float8_e4m3fn), ("fp8", torch.bfloat16), ("bf16", torch.bfloat16)):
            index_pages = torch.zeros(3, 64, index_format(fmt).token_bytes, dtype=torch.uint8)
            ops.indexer_score(odd(tokens, 4, 128).to(q_dtype), odd(tokens, 4), index_pages, table, req, pos, fmt, 200)
        for width in (1 << 17, 40003, 5000):  # groups, bound and (both modes) registers up to 8K
            ops.topk(odd(tokens, width), torch.full((tokens,), width, dtype=torch.int32), 64)
        heads, dim = 4, 24
        qkv = [odd(tokens, heads, dim, dtype=torch.bfloat16) for _ in range(3)]
        gates = odd(tokens, heads, dim), odd(tokens, heads)
        pool, ids = torch.zeros(3, heads, dim, dim), torch.tensor([0, 2], dtype=torch.int32)
        cu = torch.tensor([0, 2, tokens], dtype=torch.int32)
        ops.kda_prefill(*qkv, *gates, cu, pool, ids, 0.1, True)
        ops.kda_prefill_chunked_mixed(*qkv, *gates, cu, pool, ids, 0.1, True)
        ops.kda_decode(*(x[:2] for x in (*qkv, *gates)), pool, ids, 0.1, True)
        ops.lse_combine(odd(4, tokens, heads, 512), odd(4, tokens, heads))
    finally:
        for fn in config._CACHED:
            fn.cache_clear()
    used = {key: w.cache_calls for key, w in wrappers.items()}
    assert all(not w.twin.calls and not w.kernel.calls for w in wrappers.values())
    # every declared kernel the NVIDIA backend launches on these calls was reached
    assert {key for key, calls in used.items() if calls} >= {
        "sparse_mla:sparse_mla_kernel", "sparse_mla_small_heads:sparse_mla_small_heads_kernel",
        "sparse_mla_small_heads_raw:sparse_mla_small_heads_raw_kernel", "indexer:indexer_score_kernel",
        "indexer_decode:indexer_tiles_kernel", "kda:kda_recurrent_kernel", "kda:kda_decode_step_kernel",
        "kda_chunk:kda_chunk_prepare_kernel", "kda_chunk:kda_chunk_state_kernel", "lse_combine:lse_combine_kernel",
        "topk_groups:group_max_kernel", "topk_groups:group_compact_kernel", "topk_bound:bound_max_kernel",
        "topk_bound:bound_compact_kernel", "topk_registers:topk_registers_kernel"}, used


def test_the_configuration_memo_is_bounded_and_gives_the_unmemoised_key(monkeypatch):
    """The batch-invariant configuration key is memoised per launch site's keywords (5 us a decision, not 9): the
    memoised key is the computed one, and keywords that change every call (a tensor passed by keyword) stop
    filling the memo at its bound."""
    monkeypatch.setattr(compile_budget, "CONFIG_MEMO", 3)
    wrapper = cache_budgeted(0)
    base = torch.zeros(64, dtype=torch.uint8)
    first = wrapper._config((base, base, 16, 7), {"BLOCK": 16, "num_warps": 4})
    assert wrapper._config((base, base, 16, 7), {"BLOCK": 16, "num_warps": 4}) is first
    assert first == ("cache twin", ("BLOCK", 16), ("num_warps", 4))
    assert wrapper._config((base, base, 16, 7), {"num_warps": 4, "BLOCK": 16}) == first  # another order, same key
    for _ in range(5):
        wrapper._config((base, base, 16), {"BLOCK": 16, "n": torch.zeros(1)})
    assert len(wrapper.config_of) == 3
