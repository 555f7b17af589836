"""``python -m dsahal.backends.nvidia.aot``: the shared kernels compiled for sm_90 without a GPU."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from dsahal.backends.nvidia import aot, sass  # noqa: E402
from dsahal.kernel_launch import triton_launch  # noqa: E402


def test_variants_cover_the_fast_and_the_exact_paths():
    names = [v.name for v in aot.variants()]
    assert any("indexer" in n and "exact" in n for n in names)
    assert any("sparse MLA" in n and "exact" in n for n in names)
    assert any(n.startswith("top-k") for n in names) and any(n.startswith("KDA") for n in names)
    for variant in aot.variants():  # every non-constexpr argument gets a type the compiler accepts
        assert set(variant.signature()) == set(triton_launch(variant.kernel).arg_names)
    assert len(set(names)) == len(names)  # --only picks by name


def test_every_variant_names_every_constexpr_of_its_kernel():
    # a constexpr left out of a variant's constexprs is compiled as a run-time i32 argument (Variant.signature): a
    # different kernel from the launch's, its branches on that flag no longer resolved at compile time (twenty-seventh
    # session: the general indexer's SCALED_DOT and the Gluon indexer's MX_REG on its FP8-key launches)
    for variant in aot.variants():
        names = {p.name for p in triton_launch(variant.kernel).params if p.is_constexpr}
        assert names <= set(variant.constexprs), (variant.name, sorted(names - set(variant.constexprs)))


def test_variants_see_through_the_compile_budgets_wrapper(monkeypatch):
    """A process that installed the compile budget (batch-invariant mode, or an earlier test) has its launched kernels
    wrapped: the variants still read the JIT function's arguments (CI once failed on the top-k split kernels)."""
    from dsahal.backends.triton_kernels import compile_budget, topk_split

    kernel = topk_split.split_write_kernel
    if isinstance(kernel, compile_budget.BudgetedKernel):  # (an earlier test in this process installed the budget)
        kernel = kernel.kernel
    monkeypatch.setattr(topk_split, "split_write_kernel", compile_budget.BudgetedKernel(kernel, 1))
    (variant,) = [v for v in aot.variants() if v.name == "top-k split rows: split_write_kernel"]
    assert isinstance(variant.kernel, compile_budget.BudgetedKernel)
    assert set(variant.signature()) == set(triton_launch(kernel).arg_names)
    assert aot.run_time_alignment(variant)


def test_variants_include_the_kernels_the_backend_launches_by_default():
    """The defaults: block-tile indexer (FP8 keys alu 5: 69 from the fifteenth session to the twenty-second, bf16 q
    with flag 128 since the eighteenth; MXFP4 mode 4 with alu 12 / 140 for FP8 / bf16 q), the few-heads
    sparse MLA (raw e4m3 at 16 heads, the chunked kernel for nvfp4 and 32 heads), the chunked KDA prefill's
    two passes and the KDA decode step."""
    by_name = {v.name: v for v in aot.variants()}
    kernels = {name: triton_launch(v.kernel).__name__ for name, v in by_name.items()}  # (through a compile budget)
    for wanted, kernel in (("indexer block tiles, fp8 keys, fp8 q", "indexer_tiles_kernel"),
                           ("indexer block tiles, fp8 keys, bf16 q", "indexer_tiles_kernel"),
                           ("indexer block tiles, mxfp4 keys, fp8 q", "indexer_tiles_kernel"),
                           ("indexer block tiles, mxfp4 keys, bf16 q", "indexer_tiles_kernel"),
                           ("sparse MLA few heads, raw e4m3, fp8_ds_mla, H=16", "sparse_mla_small_heads_raw_kernel"),
                           ("sparse MLA few heads, chunked, nvfp4, H=16", "sparse_mla_small_heads_kernel"),
                           ("sparse MLA few heads, chunked, fp8_ds_mla, H=32", "sparse_mla_small_heads_kernel"),
                           ("KDA chunk pass A", "kda_chunk_prepare_kernel"),
                           ("KDA chunk pass B", "kda_chunk_state_kernel"),
                           ("KDA decode step", "kda_decode_step_kernel")):
        assert [k for n, k in kernels.items() if n.startswith(wanted)] == [kernel], wanted
    tiles = {n: v.constexprs for n, v in by_name.items() if n.startswith("indexer block tiles")}
    # (bf16 q: alu flag 128 since the eighteenth session, its split queries on the FP8 MMA path, DOT 1)
    assert [(cx["FMT"], cx["ALU"], cx["MX"], cx["SCALED_DOT"], cx["DOT"]) for cx in tiles.values()] == [
        (1, 5, 0, 0, 1), (1, 133, 0, 0, 1), (2, 12, 4, 0, 0), (2, 140, 4, 0, 0)]
    assert all(v.divisible == ("s8_b", "s32_b") for n, v in by_name.items() if n.startswith("indexer block tiles"))


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _assert_variant_is_the_launch(variant, args, kwargs):
    """The variant compiles what this launch would: its constexprs, pointer element types, float scalars,
    integers of value 1 as constexprs and the multiples of 16 among the specialised integers as facts."""
    import torch

    names = triton_launch(variant.kernel).arg_names
    skip = {p.name for p in variant.kernel.params if p.do_not_specialize}
    facts = {names[i] for (i,) in aot.run_time_alignment(variant)}
    for name, value in zip(names, args):
        if isinstance(value, torch.Tensor):
            assert variant.pointers.get(name) == aot._triton_type(value.dtype), (variant.name, name)
        elif isinstance(value, float):
            assert name in variant.floats, (variant.name, name)
        elif value == 1 and name not in skip:
            assert variant.constexprs.get(name) == 1, (variant.name, name)
        else:
            assert (name in facts) == (value % 16 == 0 and name not in skip), (variant.name, name, value)
    options = {"num_warps", "num_stages", "maxnreg"}
    assert {k: v for k, v in kwargs.items() if k not in options} == \
        {k: v for k, v in variant.constexprs.items() if k not in names[:len(args)]}, variant.name
    assert (kwargs.get("num_warps", 4), kwargs.get("num_stages", aot._default_stages()), kwargs.get("maxnreg")) == \
        (variant.num_warps, variant.num_stages, variant.maxnreg), variant.name


def test_the_new_variants_are_what_the_backend_launches(monkeypatch):
    """Run the NVIDIA backend's own op functions on CPU tensors of the modelled shapes with the kernels
    replaced by recorders, and compare each launch with its variant (catches a config or launcher change
    the variant list did not follow)."""
    import torch

    from dsahal.backends.nvidia import ops
    from dsahal.backends.triton_kernels import indexer_decode, kda, kda_chunk, segments
    from dsahal.backends.triton_kernels import sparse_mla_small_heads as small
    from dsahal.backends.triton_kernels import sparse_mla_small_heads_raw as raw

    by_name = {v.name: v for v in aot.variants()}  # (before the kernels are replaced)
    recorders = {}
    for module, name in ((indexer_decode, "indexer_tiles_kernel"), (small, "sparse_mla_small_heads_kernel"),
                         (raw, "sparse_mla_small_heads_raw_kernel"), (kda_chunk, "kda_chunk_prepare_kernel"),
                         (kda_chunk, "kda_chunk_state_kernel"), (kda, "kda_decode_step_kernel"),
                         (kda, "kda_recurrent_kernel")):
        recorders[name] = _Recorder()
        monkeypatch.setattr(module, name, recorders[name])
    monkeypatch.setattr(segments, "_plan_kernel", _Recorder())  # the segment plan: not modelled here
    monkeypatch.setattr(indexer_decode, "runs_ptx", lambda device: True)  # as a CUDA launch (the L2 hint on)
    for module in (small, raw):  # the split partials' merge: another kernel, not modelled here
        monkeypatch.setattr(module, "lse_combine", lambda o, lse, out_dtype: (o[0], lse[0]))

    def launches(prefix, kernel, call):
        recorders[kernel].calls.clear()
        call()
        chosen = [v for n, v in by_name.items() if n.startswith(prefix)]
        assert len(chosen) == 1 and len(recorders[kernel].calls) == 1, (prefix, len(recorders[kernel].calls))
        _assert_variant_is_the_launch(chosen[0], *recorders[kernel].calls[0])

    tokens, context, heads = 5, 1024, aot.INDEXER_HEADS
    for fmt, q_dtype, label in (("fp8", torch.float8_e4m3fn, "fp8"), ("fp8", torch.bfloat16, "bf16"),
                                ("mxfp4", torch.float8_e4m3fn, "fp8"), ("mxfp4", torch.bfloat16, "bf16")):
        record = {"fp8": 132, "mxfp4": 68}[fmt]
        args = (torch.zeros(tokens, heads, 128).to(q_dtype), torch.zeros(tokens, heads),
                torch.zeros(4, aot.BLOCK_TOKENS, record, dtype=torch.uint8),
                torch.zeros(1, context // aot.BLOCK_TOKENS, dtype=torch.int32), torch.zeros(tokens, dtype=torch.int32),
                torch.arange(tokens, dtype=torch.int32), fmt, context)
        launches(f"indexer block tiles, {fmt} keys, {label} q", "indexer_tiles_kernel",
                 lambda: ops.indexer_score(*args))
    for heads, fmt, prefix, kernel in ((16, "fp8_ds_mla", "sparse MLA few heads, raw e4m3",
                                        "sparse_mla_small_heads_raw_kernel"),
                                       (16, "nvfp4", "sparse MLA few heads, chunked", "sparse_mla_small_heads_kernel"),
                                       (32, "fp8_ds_mla", "sparse MLA few heads, chunked",
                                        "sparse_mla_small_heads_kernel")):
        record = {"fp8_ds_mla": 656, "nvfp4": 352}[fmt]
        args = (torch.zeros(4, heads, 576, dtype=torch.bfloat16), torch.zeros(3, aot.BLOCK_TOKENS, record,
                                                                             dtype=torch.uint8),
                torch.zeros(4, aot.TOPK, dtype=torch.int32), fmt, None, 0.1)
        launches(f"{prefix}, {fmt}, H={heads}", kernel, lambda: ops.sparse_mla_small_heads(*args))
    sequences, heads, dim = aot.KDA_SEQUENCES, aot.KDA_HEADS, aot.KDA_DIM
    tokens = 16 * sequences
    qkv = [torch.zeros(tokens, heads, dim, dtype=torch.bfloat16) for _ in range(3)]
    gates = (torch.zeros(tokens, heads, dim), torch.zeros(tokens, heads))  # the model's fp32 g and beta
    cu = torch.arange(0, tokens + 1, 16, dtype=torch.int32)
    pool, ids = torch.zeros(3, heads, dim, dim), torch.zeros(sequences, dtype=torch.int32)
    prefill = (*qkv, *gates, cu, pool, ids, 0.1, True)
    launches("KDA chunk pass A", "kda_chunk_prepare_kernel", lambda: ops.kda_prefill_chunked_mixed(*prefill))
    launches("KDA chunk pass B", "kda_chunk_state_kernel", lambda: ops.kda_prefill_chunked_mixed(*prefill))
    launches("KDA recurrent step", "kda_recurrent_kernel", lambda: ops.kda_prefill(*prefill))
    step = (*(x[:sequences] for x in (*qkv, *gates)), pool, ids, 0.1, True)
    launches("KDA decode step", "kda_decode_step_kernel", lambda: ops.kda_decode(*step))


def test_the_general_sparse_mla_combine_and_groups_top_k_variants_are_what_the_backend_launches(monkeypatch):
    """As above for the general sparse-MLA kernel at H = 128 on fp8_ds_mla pages (a DSA layer's latents where
    FlashMLA is not installed), the LSE combine after a 4-way split, the groups top-k's four launches at 128K and the
    bound method's at 32K."""
    import torch

    from dsahal.backends.nvidia import ops
    from dsahal.backends.triton_kernels import lse_combine, sparse_mla, topk_bound, topk_groups

    by_name = {v.name: v for v in aot.variants()}
    recorders = {}
    for module, name in ((sparse_mla, "sparse_mla_kernel"), (lse_combine, "lse_combine_kernel"),
                         (topk_groups, "group_max_kernel"), (topk_groups, "bound_threshold_kernel"),
                         (topk_groups, "group_compact_kernel"), (topk_groups, "bound_finish_kernel")):
        recorders[name] = _Recorder()
        monkeypatch.setattr(module, name, recorders[name])

    def launches(name, kernel, call):
        recorders[kernel].calls.clear()
        call()
        assert len(recorders[kernel].calls) == 1, (name, len(recorders[kernel].calls))
        _assert_variant_is_the_launch(by_name[name], *recorders[kernel].calls[0])

    q = torch.zeros(320, 128, 576, dtype=torch.bfloat16)
    pages = torch.zeros(3, aot.BLOCK_TOKENS, 656, dtype=torch.uint8)
    slots = torch.zeros(320, aot.TOPK, dtype=torch.int32)
    launches("sparse MLA fp8_ds_mla latents, bf16 q, H=128", "sparse_mla_kernel",
             lambda: ops.sparse_mla(q, pages, slots, "fp8_ds_mla", None, 0.1))
    parts = torch.zeros(4, 16, 16, 512), torch.zeros(4, 16, 16)
    launches("lse combine, 4 fp32 parts of 512", "lse_combine_kernel",
             lambda: lse_combine.lse_combine(*parts, out_dtype=torch.bfloat16))
    scores, lengths = torch.zeros(2, 1 << 17), torch.full((2,), 1 << 17, dtype=torch.int32)
    req, table = torch.zeros(2, dtype=torch.int32), torch.zeros(1, (1 << 17) // aot.BLOCK_TOKENS, dtype=torch.int32)
    from dsahal.backends.triton_kernels import topk as topk_module

    for name, kernel in (("group maxima", "group_max_kernel"), ("threshold", "bound_threshold_kernel"),
                         ("compaction", "group_compact_kernel"), ("finish emitting slots", "bound_finish_kernel")):
        launches(f"top-k groups (128K rows): {name}", kernel,
                 lambda: topk_module.topk(scores, lengths, aot.TOPK, emit_slots=(req, table, aot.BLOCK_TOKENS),
                                          **ops.config.topk_config(1 << 17)))
    for name in ("bound_max_kernel", "bound_threshold_kernel", "bound_compact_kernel", "bound_finish_kernel"):
        recorders[name] = _Recorder()
        monkeypatch.setattr(topk_bound, name, recorders[name])
    scores, lengths = torch.zeros(2, 1 << 15), torch.full((2,), 1 << 15, dtype=torch.int32)
    for name, kernel in (("lane maxima", "bound_max_kernel"), ("threshold", "bound_threshold_kernel"),
                         ("compaction", "bound_compact_kernel"), ("finish emitting slots", "bound_finish_kernel")):
        launches(f"top-k bound (32K rows): {name}", kernel,
                 lambda: topk_module.topk(scores, lengths, aot.TOPK, emit_slots=(req, table, aot.BLOCK_TOKENS),
                                          **ops.config.topk_config(1 << 15)))


# cuobjdump -sass lines (one instruction and its encoding line each); a loop 0x20..0xe0 with an inner loop
# 0x90..0xa0, a forward branch and the tail BRA to itself
_SASS = """
	code for sm_90a
		Function : toy_kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                    /* 0x00000a00ff017b82 */
                                                                             /* 0x000ff00000000800 */
        /*0010*/                   S2R R0, SR_TID.X ;                        /* 0x0000000000007919 */
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;          /* 0x0000000402047981 */
        /*0030*/              @!P0 LDG.E.U8 R8, desc[UR4][R2.64+0x10] ;      /* 0x0000100402088981 */
        /*0040*/                   STS.64 [R3], R4 ;                         /* 0x0000000403007388 */
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;             /* 0x0000000000007b1d */
        /*0060*/                   HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24 ;  /* 0x00e0000008187df0 */
        /*0070*/                   F2FP.BF16.F32.PACK_AB R9, R5, R4 ;        /* 0x000000040509723e */
        /*0080*/                   PRMT R10, R8, 0x7604, R9 ;                /* 0x00007604080a7816 */
        /*0090*/                   IMAD.WIDE.U32 R2, R0, 0x4, R2 ;           /* 0x0000000400027825 */
        /*00a0*/               @P2 BRA 0x90 ;                                /* 0xfffffffc00f02947 */
        /*00b0*/                   UIADD3 UR4, UR4, 0x1, URZ ;               /* 0x0000000104047890 */
        /*00c0*/                   FFMA R11, R4, R5, R6 ;                    /* 0x000000050b0b7223 */
        /*00d0*/              @P3 BRA 0x100 ;                                /* 0x0000000000f03947 */
        /*00e0*/                   MOV R12, R11 ;                            /* 0x0000000b000c7202 */
        /*00f0*/               @P1 BRA 0x20 ;                                /* 0xffffffff00c01947 */
        /*0100*/                   EXIT ;                                    /* 0x000000000000794d */
        /*0110*/                   BRA 0x110;                                /* 0xfffffffc00fc7947 */
"""


def test_the_sass_profile_counts_the_largest_backward_branch_region_by_class():
    profile = sass.loop_profile(_SASS)
    assert (profile.first, profile.last, profile.kernel_instructions) == (0x20, 0xF0, 18)
    assert {name: dict(counts) for name, counts in profile.classes.items()} == {
        "global": {"LDG.128": 1, "LDG.8": 1}, "shared": {"STS.64": 1}, "barrier": {"BAR": 1}, "mma": {"HGMMA": 1},
        "convert": {"F2FP": 1}, "permute": {"PRMT": 1}, "integer": {"IMAD": 1, "UIADD3": 1}, "float": {"FFMA": 1},
        "move": {"MOV": 1}, "other": {"BRA": 3}}
    assert profile.instructions == 14  # 0x20 .. 0xf0, the LDC / S2R before it and the EXIT after it left out
    text = sass.format_profile(profile)
    assert "main loop 0x20-0xf0: 14 of the kernel's 18 instructions" in text
    assert "  global       2  LDG.128 1, LDG.8 1" in text and "  integer      2  IMAD 1, UIADD3 1" in text
    straight = "\n".join(line for line in _SASS.splitlines() if "BRA" not in line)
    assert sass.loop_profile(straight) is None and "straight-line" in sass.format_profile(None)


@pytest.mark.parametrize("opcode, expected", [
    ("STG.E.64", ("global", "STG.64")), ("LDG.E.U16.CONSTANT", ("global", "LDG.16")), ("LDG.E", ("global", "LDG.32")),
    ("LDGSTS.E.BYPASS.LTC128B.128", ("global", "LDGSTS.128")), ("LDS.U8", ("shared", "LDS.8")),
    ("LDSM.16.M88.4", ("shared", "LDSM")), ("LDGDEPBAR", ("barrier", "LDGDEPBAR")),
    ("WARPGROUP.DEPBAR.LE", ("barrier", "WARPGROUP")), ("QGMMA.64x64x32.F32.E4M3.E4M3", ("mma", "QGMMA")),
    ("IMMA.16816.S8.S8", ("mma", "IMMA")), ("HMMA.16816.F32.BF16", ("mma", "HMMA")),
    ("I2F.F32.S32", ("convert", "I2F")), ("F2F.F16.F32", ("convert", "F2F")), ("PRMT", ("permute", "PRMT")),
    ("LOP3.LUT", ("integer", "LOP3")), ("SHF.R.U32.HI", ("integer", "SHF")), ("ISETP.GE.AND", ("integer", "ISETP")),
    ("ULOP3.LUT", ("integer", "ULOP3")), ("FMNMX", ("float", "FMNMX")), ("FSEL", ("float", "FSEL")),
    ("MUFU.EX2", ("float", "MUFU")), ("UMOV", ("move", "UMOV")), ("SHFL.BFLY", ("move", "SHFL")),
    ("BSSY", ("other", "BSSY"))])
def test_opcodes_fall_in_their_classes(opcode, expected):
    assert sass.classify(opcode) == expected


def test_only_with_no_matching_variant_is_one_error_line(capsys):
    assert aot.main(["--only", "no such kernel"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --only no such kernel: no variant name contains") and err.count("\n") == 1
    assert "--list names them" in err


def test_list_names_the_variants_without_compiling(capsys, monkeypatch):
    monkeypatch.setattr(aot, "compile_variant", lambda variant: pytest.fail("--list compiled a variant"))
    assert aot.main(["--list", "--only", "top-k"]) == 0
    assert "top-k" in capsys.readouterr().out.splitlines()


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
    names = triton_launch(kda.kda_recurrent_kernel).arg_names
    facts = {names[i]: attrs for (i,), attrs in run_time_alignment(variant).items()}
    assert set(facts) >= {"q_ptr", "state_ptr", "stride_qn", "stride_sp", "K"}
    assert not {"scale", "H", "V", "P", "BLOCK_K"} & set(facts)
    assert all(attrs == [["tt.divisibility", 16]] for attrs in facts.values())


def test_the_invariant_twin_keeps_the_caches_and_the_launcher_aligned_facts_only():
    """``--invariant`` compiles each variant as batch-invariant mode does (compile_budget's cache twin): the facts of
    the kernel module's CACHE_ARGS and LAUNCHER_ALIGNED_ARGS; a kernel without cache arguments runs the fully generic
    twin (no facts); a Gluon kernel is not twinned."""
    from dsahal.backends.triton_kernels import sparse_mla

    chosen = {v.name: v for v in aot.variants()}
    mla = chosen["sparse MLA fp8_ds_mla latents, bf16 q, H=128"]
    twin = aot.invariant_twin(mla)
    names = triton_launch(mla.kernel).arg_names
    kept = {names[i] for (i,) in aot.run_time_alignment(twin)}
    everything = {names[i] for (i,) in aot.run_time_alignment(mla)}
    allowed = (set(sparse_mla.CACHE_ARGS["sparse_mla_kernel"])
               | set(sparse_mla.LAUNCHER_ALIGNED_ARGS["sparse_mla_kernel"]))
    assert kept == everything & allowed and {"q_ptr", "o_ptr", "pages_u8", "s8_t"} <= kept
    assert not kept & {"slots_ptr", "stride_st", "lse_ptr", "stride_ls"}  # the batch's own, unaligned possibly
    assert "s16_t" not in kept  # fp8_ds_mla's 656-byte records: 328 elements of 16 bits, not a multiple of 16
    assert aot.run_time_alignment(aot.invariant_twin(chosen["top-k"])) == {}
    assert aot.invariant_twin(next(v for v in chosen.values() if v.gluon)) is None


@pytest.mark.parametrize("name", [
    "sparse MLA fp8_ds_mla latents, bf16 q, H=128",  # the DSA layer's latents without FlashMLA (was 3.5x)
    "sparse MLA few heads, raw e4m3, fp8_ds_mla, H=16",
    "indexer block tiles, fp8 keys, bf16 q, 32 heads, alu 133, 5-token segments",
    "top-k groups (128K rows): group maxima",
    "KDA decode step (scalar row)",
    "lse combine, 4 fp32 parts of 512",
])
def test_batch_invariant_compiles_are_the_default_compiles(name):
    """Batch-invariant mode's compile (the facts of CACHE_ARGS and LAUNCHER_ALIGNED_ARGS only) of the backend's hot
    launches is the default compile's SASS, line for line: a declaration dropped or a launcher that stops aligning
    a tensor shows here as slower code (the thirtieth session's 7.59 ms against 2.09 was such a gap)."""
    variant = next(v for v in aot.variants() if v.name == name)
    default, twin = (aot.compile_variant(v) for v in (variant, aot.invariant_twin(variant)))
    assert default.error == "" and twin.error == "", (default.error, twin.error)
    lines = [sass.sass_instructions(sass.cuobjdump(c.cubin, "-sass")) for c in (default, twin)]
    assert sass.same_sass_verdict(*lines).startswith("batch-invariant compile: the default compile's SASS"), \
        sass.same_sass_verdict(*lines)
