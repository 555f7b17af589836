"""Compile the shared Triton kernels for Hopper (sm_90) without a GPU: compile time and resources.

``python -m dsahal.backends.nvidia.aot [--only NAME...] [--sass] [--invariant]`` compiles the variants the NVIDIA
backend launches — the tuned fast paths and the exact fp32 paths the conformance suite draws — through Triton's
ahead-of-time API and the ``ptxas``/``cuobjdump`` that ship in Triton's wheel, and prints per
variant the compile seconds, registers per thread, stack bytes (spills land there) and shared
memory. It needs no device, so a developer on a CPU machine can see a variant that would keep
``ptxas`` busy for minutes or spill before spending GPU time: the exact fp32 path of the v3 indexer
took 403 s to compile here (it unrolled a [64 keys, 8 tokens x 32 heads] FMA dot four times) and
stalled the H200 conformance run of 2026-11-29.

``--sass`` adds, per variant, the SASS opcode counts of the kernel's main loop (the largest region a
backward branch closes) by class: global and shared-memory loads / stores with their widths, barriers,
MMAs, conversions, byte permutes, integer ALU, float, moves, other (:mod:`.sass`). That is where the
instruction-bound kernels spend their time (the indexer's block tiles were integer-ALU bound:
``indexer_decode.ALU_FLAGS``).

``--invariant`` also compiles each variant as batch-invariant mode does (:func:`invariant_twin`: the facts of its
module's ``CACHE_ARGS`` and ``LAUNCHER_ALIGNED_ARGS`` only) and says whether that compile is the default compile's
SASS (the reading that found batch-invariant mode's fully generic compile at 128 heads, thirty-first session).

Numbers come from the local Triton, which may be newer than a GPU machine's: read them as a guide,
not as the device's (the GPU's own figures come from ``python -m dsahal.backends.nvidia.tune``).
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import dataclass, field

from dsahal.kernel_launch import triton_launch

from .sass import cubin_resources, format_profile, loop_profile, same_sass_verdict, sass_instructions
from .sass import cuobjdump as _cuobjdump  # (also the name the H200 scripts use)

HOPPER = ("cuda", 90, 32)  # backend, compute capability, warp size
# The launches the variants model: the serving shapes the configs were tuned on.
BLOCK_TOKENS = 64  # tokens per cache block (the packed cache's default, dsahal.cache.layout)
INDEXER_HEADS = 32
INDEXER_CONTEXT = 131072  # max_context of the 64-request decode sweeps (only the tile count depends on it)
TOPK = 2048  # slots per row of the sparse MLA launches
KDA_HEADS, KDA_DIM = 32, 128  # Kimi-Linear's KDA heads, K = V
KDA_SEQUENCES = 8  # sequences of the chunked prefill launch (8 x 4096 tokens: the H200 runs of config.py)


@dataclass(frozen=True)
class Variant:
    """One compilation: ``kernel`` (a ``@triton.jit`` function) with these constexprs and pointer types.

    ``pointers``: element type per pointer argument (Triton names: ``fp32``, ``bf16``, ``fp8e4nv``,
    ``u8``, ``i32``...); every other non-constexpr argument is an ``i32`` scalar except ``floats``.
    An integer a launch passes as 1 is a constexpr at run time (Triton specialises it): such arguments
    belong in ``constexprs``.
    """

    name: str
    kernel: object
    constexprs: dict
    pointers: dict
    floats: tuple = ()
    num_warps: int = 4
    num_stages: int = 1
    notes: str = field(default="", compare=False)
    maxnreg: int | None = None  # the launch's register cap (ptxas), where it sets one
    # Integer arguments a launch passes as multiples of 16, beyond the default (every pointer, and every
    # ``stride*`` argument the kernel specialises): what Triton's run-time specialisation tells the compiler.
    divisible: tuple = ()
    gluon: bool = False  # a ``gluon.jit`` kernel (compiled from its Gluon source)
    # Batch-invariant mode's compile (:func:`invariant_twin`): the run-time facts of these arguments only; None: all.
    kept_facts: frozenset | None = None

    def signature(self) -> dict:
        sig = {}
        for arg in triton_launch(self.kernel).arg_names:
            if arg in self.constexprs:
                sig[arg] = "constexpr"
            elif arg in self.pointers:
                sig[arg] = "*" + self.pointers[arg]
            elif arg in self.floats:
                sig[arg] = "fp32"
            else:
                sig[arg] = "i32"
        return sig


@dataclass
class Compiled:
    variant: Variant
    seconds: float
    registers: int | None
    stack_bytes: int | None
    shared_bytes: int | None
    error: str = ""
    cubin: bytes = field(default=b"", repr=False)  # for --sass
    ttgir: str = field(default="", repr=False)  # the Triton GPU IR (dataflow comparisons: .dataflow)


def run_time_alignment(variant: Variant) -> dict:
    """The divisibility facts a launch on allocator-aligned tensors gives Triton: every pointer 16-byte
    aligned, and the ``stride*`` integers (and ``variant.divisible``) multiples of 16 unless the kernel
    declares them ``do_not_specialize``. Without them the compile models unaligned launches: scalar loads,
    a 64-bit address per row, registers and spills a serving launch does not have."""
    kernel = triton_launch(variant.kernel)  # (the JIT function under the launch cache's and compile budget's wrappers)
    skip = {p.name for p in kernel.params if p.do_not_specialize}
    facts = {}
    for index, arg in enumerate(kernel.arg_names):
        if arg in variant.constexprs or arg in variant.floats or arg in skip:
            continue
        if variant.kept_facts is not None and arg not in variant.kept_facts:
            continue
        if arg in variant.pointers or arg.startswith("stride") or arg in variant.divisible:
            facts[(index,)] = [["tt.divisibility", 16]]
    return facts


def invariant_twin(variant: Variant) -> Variant | None:
    """``variant`` as batch-invariant mode compiles it (:mod:`dsahal.backends.triton_kernels.compile_budget`'s cache
    twin): the facts of its kernel module's ``CACHE_ARGS`` and ``LAUNCHER_ALIGNED_ARGS`` only; a kernel that declares
    neither runs the fully generic twin (no facts). None for a Gluon kernel (not twinned: its layouts are
    written out)."""
    import dataclasses

    from ..triton_kernels.compile_budget import declarations

    if variant.gluon:
        return None
    fn = triton_launch(variant.kernel)
    cache, aligned = declarations(variant.kernel)
    kept = frozenset(cache) | frozenset(aligned)
    # a run-time integer a launch passes as 1 is a constexpr only where the twin specialises it
    declared = {p.name for p in fn.params if p.is_constexpr}
    constexprs = {k: v for k, v in variant.constexprs.items() if k in declared or k in kept}
    return dataclasses.replace(variant, name=f"{variant.name}{TWIN_SUFFIX}", kept_facts=kept, constexprs=constexprs)


TWIN_SUFFIX = " [batch-invariant twin]"


def multiples_of_16(**values: int) -> tuple:
    """The names among ``values`` (a launch's integer arguments) that Triton specialises as multiples of 16:
    0 included (``0 % 16 == 0``), as at run time."""
    return tuple(name for name, value in values.items() if value % 16 == 0)


def compile_variant(variant: Variant) -> Compiled:
    """Compile for sm_90 and read the resources from the cubin (no driver needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource


    if variant.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    else:
        source_type = ASTSource
    source = source_type(fn=triton_launch(variant.kernel), signature=variant.signature(),
                         constexprs=variant.constexprs, attrs=run_time_alignment(variant))
    start = time.perf_counter()
    try:
        kernel = triton.compile(source, target=GPUTarget(*HOPPER),
                                options=dict(num_warps=variant.num_warps, num_stages=variant.num_stages,
                                             **({"maxnreg": variant.maxnreg} if variant.maxnreg else {})))
    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at compile time: report, go on
        return Compiled(variant, time.perf_counter() - start, None, None, None, f"{type(exc).__name__}: {exc}"[:200])
    seconds = time.perf_counter() - start
    cubin = kernel.asm["cubin"]
    registers, stack = cubin_resources(cubin)
    return Compiled(variant, seconds, registers, stack, int(kernel.metadata.shared), cubin=cubin,
                    ttgir=kernel.asm["ttgir"])


# --- the variants ----------------------------------------------------------------------------------------

def variants() -> list[Variant]:
    """The launches of the NVIDIA backend worth watching, built from its own configuration code."""
    return (_indexer_general_variants() + _indexer_block_tile_variants() + _indexer_mxfp4_word_variants()
            + _indexer_l2_variants() + _sparse_mla_variants()
            + _lse_combine_variants()
            + _small_heads_variants() + _gluon_variants() + _wgmma_variants() + _wgmma_fp4_variants()
            + _gluon_indexer_variants()
            + _topk_variants()
            + _kda_variants())


def _indexer_general_variants() -> list[Variant]:
    """The general indexer kernel (``indexer.indexer_score_kernel``): FP8 keys, and the exact fp32 path."""
    import torch

    from ..triton_kernels import indexer
    from . import config

    out = []
    index_ptrs = dict(w_ptr="fp32", pages_u8="u8", pages_u16="u16", pages_f32="fp32", block_table_ptr="i32",
                      req_ptr="i32", pos_ptr="i32", run_offset_ptr="i32", out_ptr="fp32")
    for label, q_type, dot, q_dtype in (("fp8 q", "fp8e4nv", indexer.DOT_FP8, torch.float8_e4m3fn),
                                        ("bf16 q", "bf16", indexer.DOT_BF16, torch.bfloat16),
                                        ("fp32 q (exact)", "fp32", indexer.DOT_FP32, torch.float32)):
        cfg = dict(config.indexer_config(INDEXER_HEADS, q_dtype, "fp8"))
        block_h, cfg["block_n"], cfg["group"], cfg["tiles"] = indexer.tile_shape(INDEXER_HEADS, dot, cfg["block_n"],
                                                                                 cfg["group"], cfg["tiles"])
        pipelined = [(cfg.get("pipeline", False), cfg["tiles"], cfg["num_stages"])]  # the backend's choice first
        if dot == indexer.DOT_FP8:  # the pipelined loop over fp8-typed keys, as the tune sweep runs it
            pipelined += [p for p in ((True, 16, 2), (True, 16, 3)) if p != pipelined[0]]
        runs = [(p, False) for p in pipelined] + [(p, True) for p in pipelined if p[0]]
        for (pipeline, tiles, stages), keys_as_b in runs:
            pointers = dict(index_ptrs, q_ptr=q_type, pages_u8="fp8e4nv" if pipeline else "u8")
            out.append(Variant(
                f"indexer fp8 keys, {label}, {INDEXER_HEADS} heads"
                + (f", pipelined x{tiles}, {stages} stages" if pipeline else "") + (", keys as B" if keys_as_b else ""),
                indexer.indexer_score_kernel,
                dict(FMT=1, DOT=dot, TOKEN_BYTES=132, BLOCK_H=block_h, BLOCK_N=cfg["block_n"], GROUP=cfg["group"],
                     TILES=tiles, ALIGNED=True, PIPELINE=pipeline, KEYS_AS_B=keys_as_b,
                     ONE_BLOCK=cfg.get("one_block_tiles", True) and cfg["block_n"] == 64, SCALED_DOT=0),
                pointers, num_warps=cfg["num_warps"], num_stages=stages))
    return out


def block_tile_launch(q_dtype, index_fmt: str, heads: int = INDEXER_HEADS, block_tokens: int = BLOCK_TOKENS,
                      max_context: int = INDEXER_CONTEXT, l2_ahead: int | None = None) -> dict:
    """What ``indexer.indexer_score`` -> ``indexer_decode.launch`` passes ``indexer_tiles_kernel`` under the
    backend's ``indexer_config``, step by step as those two functions derive it: ``constexprs``, ``pointers``
    (element types), ``divisible``, ``num_warps``, ``num_stages``; ``l2_ahead`` replaces the config's L2 hint.
    ``group_per_request`` (on for FP8 keys: from 2 tokens a request with FP8 queries, always with bf16 ones) does not
    change these 5-token variants (a 5-token decode step); a call with fewer tokens per request compiles shorter
    segments."""
    import triton

    from dsahal.formats import INDEX_FORMATS

    from ..triton_kernels import grid, indexer, indexer_decode
    from ..triton_kernels.bytes import INDEX_CODES
    from . import config

    cfg = config.indexer_config(heads, q_dtype, index_fmt)
    # indexer_score: the general kernel's arguments, then the block_tiles dict on top of them
    tile = dict(block_n=cfg["block_n"], group=cfg["group"], tiles=cfg["tiles"], pipeline=cfg.get("pipeline", False),
                num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], typed_keys=cfg.get("typed_keys", False),
                tile_group=None, tile_loop=None)
    tile.update(cfg["block_tiles"])
    dot = indexer.pick_dot(q_dtype, index_fmt)
    mxfp4 = index_fmt == "mxfp4"
    mxfp4_mode = tile.get("mxfp4_mode", 0) if mxfp4 else 0
    alu = indexer_decode.fitting_alu(tile.get("alu", 0), index_fmt, tile["block_n"], block_tokens, mxfp4_mode,
                                     dot=dot, q_dtype=q_dtype)
    dot = indexer_decode.kernel_dot(dot, index_fmt, alu)
    fast_math = cfg.get("mxfp4_fast_math", False)
    scaled_dot = ((2 if fast_math else 1) if mxfp4 and cfg.get("mxfp4_dot_scaled", True) and not mxfp4_mode else 0)
    loop = (2 if tile["pipeline"] else 0) if tile["tile_loop"] is None else tile["tile_loop"]
    # indexer_decode.launch
    block_n = indexer_decode.tile_keys(block_tokens, tile["block_n"])
    tiles = max(tile["tiles"], triton.cdiv(max_context, block_n * grid.MAX_GRID_YZ))  # (grid axis 1's cap)
    token_bytes = INDEX_FORMATS[index_fmt].token_bytes
    group = min(tile["tile_group"] or tile["group"], indexer_decode.MAX_GROUP)
    # (indexer_score's hint for a decode step of that many tokens a request)
    l2_ahead = indexer._l2_ahead(tile.get("l2_ahead", 0), group, 1, tile.get("l2_ahead_tokens")) \
        if l2_ahead is None else l2_ahead
    l2_lines = triton.next_power_of_2(triton.cdiv(block_n * token_bytes, 128) + 1) if l2_ahead else 0
    typed = tile["typed_keys"] and index_fmt == "fp8" and dot == indexer_decode.DOT_FP8
    s8_b = block_tokens * token_bytes  # standalone pages; the packed cache's rows are 256-byte multiples too
    words = index_fmt == "fp8" or bool(alu & 8)  # the launcher's int32 (fp32) view: FP8 keys, MXFP4 word loads
    s32_b = s8_b // 4 if words else 0  # otherwise never read (stride 0)
    return dict(
        constexprs=dict(H=heads, FMT=INDEX_CODES[index_fmt], DOT=dot, TOKEN_BYTES=token_bytes,
                        BLOCK_H=max(16, triton.next_power_of_2(heads)), BLOCK_N=block_n,
                        GROUP=group,
                        TILES=tiles if loop == 0 else 0, LOOP=loop, SCALED_DOT=scaled_dot, MX=mxfp4_mode, ALU=alu,
                        L2_AHEAD=l2_ahead, L2_LINES=l2_lines),
        pointers=dict(q_ptr=_triton_type(q_dtype), w_ptr="fp32", pages_u8="fp8e4nv" if typed else "u8",
                      pages_f32="fp32" if words else "u8", block_table_ptr="i32", req_ptr="i32",
                      pos_ptr="i32", off_ptr="i32", seg_ptr="i32", out_ptr="fp32"),
        divisible=multiples_of_16(s8_b=s8_b, s32_b=s32_b),
        num_warps=tile["num_warps"], num_stages=tile["num_stages"])


def _indexer_block_tile_variants() -> list[Variant]:
    """The block-tile indexer (``indexer_decode.indexer_tiles_kernel``), the default for FP8 and MXFP4 keys."""
    import torch

    from ..triton_kernels import indexer_decode

    out = []
    for index_fmt, q_dtype in (("fp8", torch.float8_e4m3fn), ("fp8", torch.bfloat16),
                               ("mxfp4", torch.float8_e4m3fn), ("mxfp4", torch.bfloat16)):
        launch = block_tile_launch(q_dtype, index_fmt)
        cx = launch["constexprs"]
        if cx["MX"]:
            how = f"mxfp4_mode {cx['MX']}"
        elif cx["SCALED_DOT"]:
            how = "dot_scaled"
        else:
            how = f"alu {cx['ALU']}"
        q_name = _triton_type(q_dtype).replace("fp8e4nv", "fp8")
        out.append(Variant(
            f"indexer block tiles, {index_fmt} keys, {q_name} q, {cx['H']} heads, {how}, {cx['GROUP']}-token segments",
            indexer_decode.indexer_tiles_kernel, cx, launch["pointers"],
            num_warps=launch["num_warps"], num_stages=launch["num_stages"], divisible=launch["divisible"]))
    return out


# Candidates for the MXFP4 block tiles (not defaults): (mxfp4_mode, q dtype name, alu, tile loop), alu the sum of
# indexer_decode.ALU_FLAGS 4 (no division), 8 (int32-word loads, word-wise decode), 16 (word-order dims); loop 1
# prefetches one tile (the backend's), 3 two
MXFP4_WORD_CANDIDATES = ((4, "fp8", 8, 1), (4, "fp8", 12, 1), (4, "fp8", 24, 1), (4, "fp8", 28, 1),
                         (4, "fp8", 28, 3), (2, "bf16", 28, 1))


def _indexer_mxfp4_word_variants() -> list[Variant]:
    """The block-tile indexer on MXFP4 keys with the word decode of ``indexer_decode.ALU_FLAGS`` 8 / 16: the
    backend's launch (:func:`block_tile_launch`) with ``MX`` and ``ALU`` set and the pages' int32 (fp32) view
    the launcher passes for flag 8."""
    import torch

    from ..triton_kernels import indexer_decode

    out = []
    for mode, q_name, alu, loop in MXFP4_WORD_CANDIDATES:
        q_dtype = torch.float8_e4m3fn if q_name == "fp8" else torch.bfloat16
        launch = block_tile_launch(q_dtype, "mxfp4")
        s8_b = BLOCK_TOKENS * 68
        cx = dict(launch["constexprs"], MX=mode, ALU=alu, SCALED_DOT=0, DOT=indexer_decode.DOT_BF16, LOOP=loop)
        out.append(Variant(
            f"indexer mxfp4 keys word decode, {q_name} q, {cx['H']} heads, mxfp4_mode {mode}, alu {alu}, "
            f"{cx['GROUP']}-token segments" + (", two tiles ahead" if loop == 3 else ""), indexer_decode.indexer_tiles_kernel, cx,
            dict(launch["pointers"], pages_f32="fp32"), num_warps=launch["num_warps"],
            num_stages=launch["num_stages"], divisible=multiples_of_16(s8_b=s8_b, s32_b=s8_b // 4)))
    return out


# Candidates for the block tiles' L2 hint (launcher ``l2_ahead``: the tile that many tiles ahead asked of L2 by
# ``prefetch.global.L2``), on the backend's launches of FP8 keys (fp8 and bf16 q) and MXFP4 keys (fp8 q)
L2_CANDIDATES = (("fp8", "fp8", 2), ("fp8", "fp8", 4), ("fp8", "bf16", 4), ("mxfp4", "fp8", 4))


def _indexer_l2_variants() -> list[Variant]:
    """The block-tile indexer with the L2 hint of ``indexer_decode.launch(l2_ahead=...)`` (rolled loop 1)."""
    import torch

    from ..triton_kernels import indexer_decode

    out = []
    for index_fmt, q_name, ahead in L2_CANDIDATES:
        q_dtype = torch.float8_e4m3fn if q_name == "fp8" else torch.bfloat16
        launch = block_tile_launch(q_dtype, index_fmt, l2_ahead=ahead)
        cx = launch["constexprs"]
        out.append(Variant(
            f"indexer L2 hint {ahead} tiles ahead, {index_fmt} keys, {q_name} q, {cx['H']} heads",
            indexer_decode.indexer_tiles_kernel, cx, launch["pointers"], num_warps=launch["num_warps"],
            num_stages=launch["num_stages"], divisible=launch["divisible"]))
    return out


def _sparse_mla_variants() -> list[Variant]:
    """The general sparse MLA kernel (``sparse_mla.sparse_mla_kernel``): 128 heads, and the exact paths."""
    import torch

    from dsahal.formats import LATENT_FORMATS

    from ..triton_kernels import sparse_mla
    from ..triton_kernels.bytes import LATENT_CODES, typed_views
    from . import config

    out = []
    mla_ptrs = dict(pages_u8="u8", pages_u16="u16", pages_f32="fp32", slots_ptr="i32", kv_scale_ptr="fp32",
                    o_ptr="fp32", lse_ptr="fp32")
    for heads, fmt, q_dtype, v_split in ((128, "bf16", torch.bfloat16, 1), (128, "bf16", torch.bfloat16, 2),
                                         (128, "fp8", torch.bfloat16, 1), (128, "fp8", torch.bfloat16, 2),
                                         (128, "fp8_ds_mla", torch.bfloat16, 1),
                                         (16, "bf16", torch.bfloat16, 1), (128, "bf16", torch.float32, 1),
                                         (4, "fp8_ds_mla", torch.float32, 1)):
        cfg = config.sparse_mla_config(320, heads, TOPK, fmt, q_dtype)
        as_bf16 = q_dtype == torch.bfloat16
        q_type = "bf16" if as_bf16 else "fp32"
        split = cfg["split_size"] is not None and cfg["split_size"] < TOPK
        pointers = dict(mla_ptrs, q_ptr=q_type, o_ptr="fp32" if split else q_type)  # (fp32 partials, else final)
        if as_bf16 and fmt == "bf16":
            pointers["pages_u16"] = "bf16"  # the launcher's bf16 view
        pages = torch.empty((2, BLOCK_TOKENS, LATENT_FORMATS[fmt].token_bytes), dtype=torch.uint8, device="meta")
        strides = {f"s{bits}_{axis}": stride for bits, (_, block, token) in zip((8, 16, 32), typed_views(pages))
                   for axis, stride in (("b", block), ("t", token))}
        out.append(Variant(
            f"sparse MLA {fmt} latents, {'bf16' if as_bf16 else 'fp32 (exact)'} q, H={heads}"
            + (f", values split {v_split} ways" if v_split > 1 else ""),
            sparse_mla.sparse_mla_kernel,
            dict(FMT=LATENT_CODES[fmt], AS_BF16=as_bf16, BLOCK_H=cfg["block_h"], BLOCK_N=cfg["block_n"], ALIGNED=True,
                 V_SPLIT=v_split),
            pointers, floats=("logit_scale",), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            divisible=multiples_of_16(**strides)))
    return out


def _lse_combine_variants() -> list[Variant]:
    """The LSE combine after a split sparse-MLA launch (``lse_combine.lse_combine_kernel``): four fp32 partials of 512
    value columns (the 512-slot splits of top-k 2048), the output in bf16; the partial lse's head stride is 1 (a
    constexpr at run time)."""
    from ..triton_kernels import lse_combine

    return [Variant("lse combine, 4 fp32 parts of 512", lse_combine.lse_combine_kernel,
                    dict(BLOCK_W=lse_combine._block_w(4), BLOCK_D=lse_combine._block_d(512, 512), stride_lh=1),
                    dict(o_ptr="fp32", lse_ptr="fp32", out_ptr="bf16", out_lse_ptr="fp32"), num_warps=4,
                    num_stages=_default_stages(), divisible=multiples_of_16(D=512))]


def _small_heads_variants() -> list[Variant]:
    """The few-heads sparse MLA route as ``sparse_mla_small_heads.hopper_config`` picks it (bf16 queries, 64-token
    blocks of standalone pages, top-k 2048 in 512-slot splits, so the outputs are fp32 partials). The page
    facts (views, strides, record alignment) come from the launchers' own helpers on a meta tensor."""
    import torch

    from dsahal.formats import LATENT_FORMATS

    from ..triton_kernels import sparse_mla_small_heads as small
    from ..triton_kernels import sparse_mla_small_heads_raw as raw
    from ..triton_kernels.bytes import LATENT_CODES, row_alignment, typed_views, views_usable

    out = []
    for heads, fmt in ((16, "fp8_ds_mla"), (16, "nvfp4"), (32, "fp8_ds_mla")):
        cfg = small.hopper_config(heads, fmt, torch.bfloat16)
        pages = torch.empty((2, BLOCK_TOKENS, LATENT_FORMATS[fmt].token_bytes), dtype=torch.uint8, device="meta")
        o_type = "fp32" if -(-TOPK // cfg["split_size"]) > 1 else "bf16"  # split partials, else q's dtype
        base = dict(BLOCK_H=small.block_heads(heads), BLOCK_N=cfg["block_n"], REUSE=cfg["reuse"],
                    GATHER_FIRST=cfg["gather_first"])
        if cfg.get("raw_fp8"):  # sparse_mla_small_heads_raw: one uint8 view, byte strides, shift-and-mask slots
            out.append(Variant(
                f"sparse MLA few heads, raw e4m3, {fmt}, H={heads}", raw.sparse_mla_small_heads_raw_kernel,
                dict(base, ROPE_BF16=True, ROW_ALIGN=row_alignment(pages), BT_LOG2=BLOCK_TOKENS.bit_length() - 1),
                dict(q_ptr="bf16", pages_u8="u8", slots_ptr="i32", o_ptr=o_type, lse_ptr="fp32"),
                floats=("logit_scale",), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                divisible=multiples_of_16(s8_b=pages.stride(0), s8_t=pages.stride(1), zero=0)))
            continue
        # the chunked kernel: uint8 / uint16 / fp32 views of the pages, (block, token) strides in elements
        views = typed_views(pages)
        strides = {f"s{bits}_{axis}": stride for bits, (_, block, token) in zip((8, 16, 32), views)
                   for axis, stride in (("b", block), ("t", token))}
        out.append(Variant(
            f"sparse MLA few heads, chunked, {fmt}, H={heads}", small.sparse_mla_small_heads_kernel,
            dict(base, FMT=LATENT_CODES[fmt], AS_BF16=True, ALIGNED=views_usable(pages)),
            dict(q_ptr="bf16", **{name: _triton_type(view.dtype) for name, (view, _, _)
                                  in zip(("pages_u8", "pages_u16", "pages_f32"), views)},
                 slots_ptr="i32", kv_scale_ptr="fp32", o_ptr=o_type, lse_ptr="fp32"),
            floats=("logit_scale",), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            divisible=multiples_of_16(**strides, zero=0)))
    return out


def _gluon_variants() -> list[Variant]:
    """The Gluon few-heads kernel (``sparse_mla_gluon``) at its launcher's defaults: bf16 queries, fp8_ds_mla pages of
    back-to-back 64-token blocks under 2 GiB (flat, 32-bit offsets), 512-slot splits (fp32 partials)."""
    from ..triton_kernels import sparse_mla_gluon as gluon_mla

    block_n, stages, split = gluon_mla.DEFAULT_BLOCK_N, gluon_mla.DEFAULT_STAGES, gluon_mla.DEFAULT_SPLIT
    return [Variant(
        f"sparse MLA few heads, Gluon, fp8_ds_mla, H=16, {block_n}-slot steps, {stages} stages, {4 * split} warps",
        gluon_mla.sparse_mla_gluon_kernel, dict(BLOCK_N=block_n, STAGES=stages, FLAT=True, OFF32=True, LAZY=True,
                                                Q_SMEM=False, SPLIT=split),
        dict(q_ptr="bf16", pages_u8="u8", slots_ptr="i32", o_ptr="fp32", lse_ptr="fp32"), floats=("logit_scale",),
        num_warps=4 * split, divisible=multiples_of_16(s8_b=BLOCK_TOKENS * 656, s8_t=656), gluon=True)]


def _wgmma_variants() -> list[Variant]:
    """The wgmma few-heads kernel (``sparse_mla_wgmma``) as the backend launches it (``config.WGMMA_FEW_HEADS``: with its
    producer warpgroup, ``ws``): bf16 queries, fp8_ds_mla and per-tensor FP8 pages of back-to-back 64-token blocks
    under 2 GiB (flat, 32-bit offsets); and the balanced fp8_ds_mla launch without the producer (its warpgroup issuing
    the copies itself: the kernel before the forty-third session)."""
    from ..triton_kernels import sparse_mla_wgmma as wgmma_mla
    from . import config

    launch = config.WGMMA_FEW_HEADS

    def variant(fmt: str, record: int, balanced: bool, ws: bool) -> Variant:
        extra = dict(WS=ws, PRODUCER_REGS=launch.get("producer_regs") or wgmma_mla.DEFAULT_PRODUCER_REGS)
        return Variant(
            f"sparse MLA few heads, wgmma, {fmt}, H=16, {launch['stages']} stages" + (", balanced" if balanced else "")
            + ("" if ws else ", no producer"),
            wgmma_mla.sparse_mla_wgmma_kernel,
            dict(STAGES=launch["stages"], FLAT=True, OFF32=True, FP8=fmt == "fp8", ALIGNED=True, BALANCED=balanced,
                 **extra),
            dict(q_ptr="bf16", pages_u8="u8", slots_ptr="i32", o_ptr="fp32", lse_ptr="fp32",
                 kv_scale_ptr="fp32" if fmt == "fp8" else "bf16"),  # (fp8_ds_mla: q stands in, unread)
            floats=("logit_scale",), num_warps=4, divisible=multiples_of_16(s8_b=BLOCK_TOKENS * record, s8_t=record),
            gluon=True, maxnreg=128 if ws else None)

    ws = bool(launch.get("ws"))
    return [variant(fmt, record, balanced, ws) for fmt, record in (("fp8_ds_mla", 656), ("fp8", 576))
            for balanced in (False, True)] + ([variant("fp8_ds_mla", 656, True, False)] if ws else [])


def _wgmma_fp4_variants() -> list[Variant]:
    """The wgmma NVFP4 kernel (``sparse_mla_wgmma_fp4``) as the backend launches it (``config.WGMMA_NVFP4``, also on
    the balanced schedule, and ``config.WGMMA_NVFP4_MANY``): bf16 queries, NVFP4 pages of back-to-back 64-token
    blocks under 2 GiB (flat, 32-bit offsets)."""
    from ..triton_kernels import sparse_mla_wgmma_fp4 as fp4_mla
    from . import config

    out = []
    one, many = config.WGMMA_NVFP4, config.WGMMA_NVFP4_MANY
    for stages, maxnreg, in_flight, balanced in ((one["stages"], None, one["in_flight"], False),
                                                 (one["stages"], None, one["in_flight"], True),
                                                 (many["stages"], many["maxnreg"], many["in_flight"], False)):
        out.append(Variant(
            f"sparse MLA few heads, wgmma, nvfp4, H=16, {stages} stages, {in_flight} logit MMA(s) in flight"
            + (f", {maxnreg} registers" if maxnreg else "") + (", balanced" if balanced else ""),
            fp4_mla.sparse_mla_wgmma_fp4_kernel,
            dict(STAGES=stages, FLAT=True, OFF32=True, IN_FLIGHT=in_flight, ALIGNED=True, BALANCED=balanced),
            dict(q_ptr="bf16", pages_u8="u8", slots_ptr="i32", o_ptr="fp32", lse_ptr="fp32"), floats=("logit_scale",),
            num_warps=4, divisible=multiples_of_16(s8_b=BLOCK_TOKENS * 352, s8_t=352), gluon=True, maxnreg=maxnreg))
    return out


def _gluon_indexer_variants() -> list[Variant]:
    """The Gluon indexer (``indexer_gluon``) as the backend launches it: FP8 keys in 64-token blocks, 32 and 64 heads,
    one, two and five tokens a request (five: ``gluon_more``, speculative decode and prefill), FP8 and bf16 queries,
    the options of ``config.indexer_config``; MXFP4 keys at 32 heads, one, two and five tokens. Its padded shared layout
    compiles with the H200's Triton 3.6; Triton 3.9's Gluon refuses it (the backend then keeps the tl kernel)."""
    from ..triton_kernels import indexer_gluon
    from ..triton_kernels.indexer import gluon_options
    from . import config

    pointers = dict(w_ptr="fp32", pages_i32="i32", block_table_ptr="i32", req_ptr="i32", pos_ptr="i32",
                    off_ptr="i32", seg_ptr="i32", out_ptr="fp32")
    unfused = dict(maxima_ptr=None, MAXIMA_G=16)  # (the scores alone; the fused group maxima: _fused_maxima_variants)
    out = []
    for heads in (INDEXER_HEADS, 64):
        for label, q_type, options in (
                ("fp8", "fp8e4nv", config._FP8_Q_GLUON if heads <= 32 else config._FP8_Q_GLUON_WIDE),
                ("bf16", "bf16", config._BF16_Q_GLUON if heads <= 32 else config._BF16_Q_GLUON_WIDE)):
            stacked = label == "bf16" and options.get("gluon_stacked", False)
            for group in (1, 2, 5):
                launch = gluon_options(options, group)
                out.append(Variant(
                    f"indexer Gluon, fp8 keys, {heads} heads, {label} q, {group} token(s) a request, "
                    f"{launch['stages']} stages, depth {launch['depth']}" + (", hi and lo stacked" if stacked else "")
                    + (f", {launch['maxnreg']} registers" if launch.get("maxnreg") else "")
                    + (", head sums as MMAs" if launch.get("head_sum_mma") else ""),
                    indexer_gluon.indexer_gluon_kernel,
                    dict(H=heads, BLOCK_H=heads, GROUP=group, STAGES=launch["stages"], DEPTH=launch["depth"],
                         WHOLE=True, HI_LO=label == "bf16", MX=False, STACK=stacked, MX_REG=False, TSTACK=1,
                         HSUM=launch.get("head_sum_mma", False), WS=False, PRODUCER_REGS=40, MX_FOLD=False,
                         **unfused),
                    dict(pointers, q_ptr=q_type), num_warps=4, divisible=multiples_of_16(s32_b=BLOCK_TOKENS * 33),
                    gluon=True, maxnreg=launch.get("maxnreg")))
    options = config._MXFP4_GLUON
    mx_registers = options.get("gluon_mx_registers", False)
    # MXFP4 keys (config._MXFP4_GLUON): the launches without and with mx_fold (each key's block scales folded into its
    # decoded codes: the backend's launch since the twenty-ninth session's R1)
    for fold in (False, True):
        for label, q_type in (("fp8", "fp8e4nv"), ("bf16", "bf16")):
            for group in (1, 2, 5):
                launch = gluon_options(options, group)
                out.append(Variant(
                    f"indexer Gluon{' folded' if fold else ''}, mxfp4 keys, {label} q, {group} token(s) a request, "
                    f"{launch['stages']} stages" + (", register operands" if mx_registers else "")
                    + (", head sums as MMAs" if launch.get("head_sum_mma") else ""),
                    indexer_gluon.indexer_gluon_kernel,
                    dict(H=INDEXER_HEADS, BLOCK_H=INDEXER_HEADS, GROUP=group, STAGES=launch["stages"],
                         DEPTH=launch["depth"], WHOLE=True, HI_LO=label == "bf16", MX=True, STACK=False,
                         MX_REG=mx_registers, TSTACK=1, HSUM=launch.get("head_sum_mma", False), WS=False,
                         PRODUCER_REGS=40, MX_FOLD=fold and mx_registers and launch.get("head_sum_mma", False),
                         **unfused),
                    dict(pointers, q_ptr=q_type), num_warps=4, divisible=multiples_of_16(s32_b=BLOCK_TOKENS * 17),
                    gluon=True, maxnreg=launch.get("maxnreg")))
    return out + _fused_maxima_variants(out)


def _fused_maxima_variants(unfused: list[Variant]) -> list[Variant]:
    """The fused indexer -> top-k: the DSA layer's Gluon indexer launches at 32 heads (FP8 and bf16 queries on FP8 keys,
    FP8 queries on MXFP4 keys folded) that also store the top-k's 16-key group maxima (``maxima_ptr``): the registers
    and instructions the maxima cost, beside the same launch without them."""
    import dataclasses

    wanted = (f"fp8 keys, {INDEXER_HEADS} heads, fp8 q", f"fp8 keys, {INDEXER_HEADS} heads, bf16 q",
              "folded, mxfp4 keys, fp8 q")
    return [dataclasses.replace(v, name=v.name + ", fused group maxima",
                                constexprs={k: x for k, x in v.constexprs.items() if k != "maxima_ptr"},
                                pointers=dict(v.pointers, maxima_ptr="i32"))
            for v in unfused if any(w in v.name for w in wanted)]


def _topk_variants() -> list[Variant]:

    from ..triton_kernels import topk, topk_split
    from . import config

    out = []
    # the one-program radix kernel: no longer a default (the registers method took rows of <= 8K, thirty-sixth session),
    # a launch option of topk.topk at the parameters it last served with
    cfg = dict(chunk=2048, row_levels=2, num_warps=8)
    for emit in (False, True):
        out.append(Variant(
            f"top-k{' emitting slots' if emit else ''}", topk.topk_kernel,
            dict(EMIT_SLOTS=emit, CHUNK=cfg["chunk"], ROW_LEVELS=cfg["row_levels"]),
            dict(scores_ptr="fp32", lengths_ptr="i32", out_ptr="i32", scratch_ptr="i32", req_ptr="i32",
                 block_table_ptr="i32"), num_warps=cfg["num_warps"]))
    split_ptrs = dict(scores_ptr="fp32", lengths_ptr="i32", hist_ptr="i32", counts_ptr="i32", out_ptr="i32",
                      scratch_ptr="i32", req_ptr="i32", block_table_ptr="i32")
    for kernel, extra in ((topk_split.split_histogram_kernel, dict(LEVEL=1)), (topk_split.split_count_kernel, {}),
                          (topk_split.split_write_kernel, dict(EMIT_SLOTS=True)),
                          (topk_split.split_finish_kernel, dict(EMIT_SLOTS=True))):
        out.append(Variant(
            f"top-k split rows: {triton_launch(kernel).__name__}", kernel,
            dict(extra, ROW_LEVELS=cfg["row_levels"], CHUNK=cfg["chunk"]),
            {name: kind for name, kind in split_ptrs.items() if name in triton_launch(kernel).arg_names},
            num_warps=cfg["num_warps"]))
    return out + _topk_groups_variants() + _topk_bound_variants() + _topk_registers_variants()


def _topk_registers_variants() -> list[Variant]:
    """The registers method's launch (rows whole in one program) at 4K, 8K and 16K rows, emitting slots (a DSA
    layer's early decode and short prefill), with the warps its launcher picks."""
    import triton

    from ..triton_kernels import topk_registers

    out = []
    for width in (4096, 8192, topk_registers.MAX_WIDTH):
        warps = topk_registers.default_warps(width)
        out.append(Variant(
            f"top-k registers ({width // 1024}K rows, {warps} warps)", topk_registers.topk_registers_kernel,
            dict(EMIT_SLOTS=True, BLOCK=triton.next_power_of_2(width), PAD_CHUNK=1024),
            dict(scores_ptr="fp32", lengths_ptr="i32", out_ptr="i32", req_ptr="i32", block_table_ptr="i32"),
            num_warps=warps))
    return out


def _topk_groups_variants() -> list[Variant]:
    """The groups method's four launches as ``config.topk_config`` picks them for rows of 128K (a DSA layer's decode
    top-k: group maxima, the per-row threshold, the compaction of the live groups, the finish writing slots)."""
    from ..triton_kernels import topk_bound, topk_groups
    from . import config

    cfg = config.topk_config(1 << 17)
    size = topk_groups.auto_group_size(1 << 17, TOPK)
    per_segment = min(cfg["chunk"] * cfg["steps"], 2048 * size) // size
    hist = cfg.get("segment_histograms", False)
    i32, stages = "i32", _default_stages()  # (the launches pass no num_stages)
    return [
        Variant("top-k groups (128K rows): group maxima", topk_groups.group_max_kernel,
                dict(ROWS=cfg["chunk"] // size, G=size, SEG_HIST=hist, GROUPS=per_segment,
                     HIST_CHUNK=min(per_segment, topk_groups.MAXIMA_HIST_CHUNK)),
                dict(scores_ptr="fp32", lengths_ptr=i32, maxima_ptr=i32, hist_ptr=i32), num_warps=cfg["num_warps"],
                num_stages=stages),
        Variant("top-k groups (128K rows): threshold", topk_bound.bound_threshold_kernel,
                dict(CHUNK=min(2048, per_segment), LEVELS=topk_bound.BOUND_LEVELS, HIST0=hist),
                dict(maxima_ptr=i32, bound_ptr=i32, lengths_ptr=i32, hist_ptr=i32), num_warps=cfg["num_warps"],
                num_stages=stages),
        Variant("top-k groups (128K rows): compaction", topk_groups.group_compact_kernel,
                dict(GROUPS=per_segment, G=size, BATCH=cfg["batch"], SEG_HIST=hist,
                     HIST_CHUNK=topk_bound.SURVIVOR_HIST_CHUNK, PREFETCH=cfg.get("compact_prefetch", False)),
                dict(scores_ptr="fp32", lengths_ptr=i32, bound_ptr=i32, maxima_ptr=i32, live_ptr=i32,
                     cand_idx_ptr=i32, cand_key_ptr=i32, counts_ptr=i32, hist_ptr=i32), num_warps=cfg["num_warps"],
                num_stages=stages),
        Variant("top-k groups (128K rows): finish emitting slots", topk_bound.bound_finish_kernel,
                dict(EMIT_SLOTS=True, CHUNK=cfg["finish_chunk"], SEG_HIST=hist),
                dict(cand_idx_ptr=i32, cand_key_ptr=i32, counts_ptr=i32, bound_ptr=i32, out_ptr=i32, req_ptr=i32,
                     block_table_ptr=i32, hist_ptr=i32), num_warps=cfg["finish_warps"], num_stages=stages),
    ]


def _topk_bound_variants() -> list[Variant]:
    """The bound method's four launches as ``config.topk_config`` picks them for rows of 32K (a causal prefill's top-k
    at 32K: lane maxima, the per-row threshold, the compaction of the entries at or above it, the finish)."""
    from ..triton_kernels import topk_bound
    from . import config

    cfg = config.topk_config(1 << 15)
    hist = cfg.get("segment_histograms", False)
    i32, stages = "i32", _default_stages()  # (the launches pass no num_stages)
    return [
        Variant("top-k bound (32K rows): lane maxima", topk_bound.bound_max_kernel,
                dict(CHUNK=cfg["chunk"], SEG_HIST=hist),
                dict(scores_ptr="fp32", lengths_ptr=i32, maxima_ptr=i32, hist_ptr=i32), num_warps=cfg["num_warps"],
                num_stages=stages),
        Variant("top-k bound (32K rows): threshold", topk_bound.bound_threshold_kernel,
                dict(CHUNK=cfg["chunk"], LEVELS=topk_bound.BOUND_LEVELS, HIST0=hist),
                dict(maxima_ptr=i32, bound_ptr=i32, lengths_ptr=i32, hist_ptr=i32), num_warps=cfg["num_warps"],
                num_stages=stages),
        Variant("top-k bound (32K rows): compaction", topk_bound.bound_compact_kernel,
                dict(CHUNK=cfg["chunk"], SEG_HIST=hist, HIST_CHUNK=topk_bound.SURVIVOR_HIST_CHUNK),
                dict(scores_ptr="fp32", lengths_ptr=i32, bound_ptr=i32, cand_idx_ptr=i32, cand_key_ptr=i32,
                     counts_ptr=i32, hist_ptr=i32), num_warps=cfg["num_warps"], num_stages=stages),
        Variant("top-k bound (32K rows): finish emitting slots", topk_bound.bound_finish_kernel,
                dict(EMIT_SLOTS=True, CHUNK=cfg["finish_chunk"], SEG_HIST=hist),
                dict(cand_idx_ptr=i32, cand_key_ptr=i32, counts_ptr=i32, bound_ptr=i32, out_ptr=i32, req_ptr=i32,
                     block_table_ptr=i32, hist_ptr=i32), num_warps=cfg["finish_warps"], num_stages=stages),
    ]


# KDA inputs as the model's layer passes them (dsahal.model.kda_layer): q, k, v bf16; g and beta fp32 from the
# fused gate kernel (dsahal.model.fused.kda_gates); beta [T, H] contiguous, so its head stride is 1, which
# Triton turns into a constexpr.
_KDA_INPUTS = dict(q_ptr="bf16", k_ptr="bf16", v_ptr="bf16", g_ptr="fp32", beta_ptr="fp32")
_KDA_UNIT_STRIDES = dict(stride_bh=1)


def _kda_variants() -> list[Variant]:
    """The KDA kernels: the token-by-token recurrence, the chunked prefill's two passes, the decode step."""
    from ..triton_kernels import kda
    from . import config

    cfg = config.kda_prefill_config(KDA_DIM)
    out = [Variant(
        "KDA recurrent step (token-by-token prefill)", kda.kda_recurrent_kernel,
        dict(_KDA_UNIT_STRIDES, BLOCK_K=KDA_DIM, BLOCK_V=cfg["block_v"], VARLEN=True, L2NORM=True,
             ZERO_PADDING_OUTPUT=False),
        dict(_KDA_INPUTS, out_ptr="bf16", state_ptr="fp32", ids_ptr="i32", cu_ptr="i32"), floats=("scale",),
        num_warps=cfg["num_warps"], num_stages=_default_stages(),
        divisible=multiples_of_16(H=KDA_HEADS, K=KDA_DIM, V=KDA_DIM))]
    return out + _kda_chunk_variants() + [_kda_decode_variant()]


def _kda_chunk_variants() -> list[Variant]:
    """``kda_chunk.kda_prefill_chunked`` under ``config.kda_chunk_config(128, "mixed")``: pass A (``prepare``,
    program = chunk x head) and pass B (``recur``, program = sequence x head x V slab), ``KDA_SEQUENCES``
    sequences (the binary search then takes ``bit_length`` steps: no argument is 1)."""
    import triton

    from ..triton_kernels import kda_chunk
    from . import config

    cfg = config.kda_chunk_config(KDA_DIM, "mixed")
    code, dtype, query_dtype = kda_chunk.OPERANDS[cfg["operands"]]
    scratch, query, block = _triton_type(dtype), _triton_type(query_dtype), max(16, triton.next_power_of_2(KDA_DIM))
    scratch_ptrs = dict(w_ptr=scratch, kg_ptr=scratch, qg_ptr=query, u_ptr=scratch, aqk_ptr=scratch, decay_ptr="fp32")
    prepare = Variant(
        f"KDA chunk pass A (prepare), {cfg['operands']}, pair {cfg['pair']}", kda_chunk.kda_chunk_prepare_kernel,
        dict(_KDA_UNIT_STRIDES, BLOCK_K=block, BLOCK_V=block, C=kda_chunk.CHUNK, M=kda_chunk.MID,
             GATE_LO=kda_chunk.GATE_MIN, L2NORM=True, OPERAND=code, PAIR=kda_chunk.PAIRS[cfg["pair"]],
             INV=kda_chunk.INVERSES[cfg.get("inverse", "ieee")], SCAN=int(bool(cfg.get("scan_mma")))),
        dict(_KDA_INPUTS, cu_ptr="i32", **scratch_ptrs), floats=("scale",),
        num_warps=cfg["prepare_warps"], num_stages=_default_stages(),  # prepare() passes no num_stages
        maxnreg=cfg.get("prepare_maxnreg"),
        divisible=multiples_of_16(B=KDA_SEQUENCES, H=KDA_HEADS, K=KDA_DIM, V=KDA_DIM,
                                  search_steps=max(1, KDA_SEQUENCES.bit_length())))
    state = Variant(
        f"KDA chunk pass B (state), {cfg['operands']}, V slab {cfg['block_v']}", kda_chunk.kda_chunk_state_kernel,
        dict(BLOCK_K=block, BLOCK_V=min(cfg["block_v"], block), SCRATCH_V=block, C=kda_chunk.CHUNK, OPERAND=code,
             LONGEST_FIRST=bool(cfg.get("longest_first"))),
        dict(scratch_ptrs, out_ptr="bf16", state_ptr="fp32", ids_ptr="i32", cu_ptr="i32", order_ptr="i32"),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        divisible=multiples_of_16(H=KDA_HEADS, K=KDA_DIM, V=KDA_DIM, seq0=0))  # seq0: one range of sequences
    return [prepare, state]


def _kda_decode_variant() -> Variant:
    """``kda.kda_decode`` under ``config.kda_decode_config``: with ``scalar_row`` the one-step kernel
    (``kda_decode_step_kernel``), num_stages 3 when unset, the pool's K stride a constexpr (V: a dense pool)."""
    import triton

    from ..triton_kernels import kda
    from . import config

    cfg = config.kda_decode_config(KDA_DIM)
    if not cfg.get("scalar_row"):
        raise ValueError(f"aot: kda_decode_config expected scalar_row=True (the one-step kernel), got {cfg}")
    block_k = triton.next_power_of_2(KDA_DIM)
    block_v = min(cfg["block_v"], triton.next_power_of_2(KDA_DIM))
    options = [name for name in ("fused_output", "stream_state") if cfg.get(name)]
    return Variant(
        "KDA decode step (scalar row)" + "".join(f", {name}" for name in options), kda.kda_decode_step_kernel,
        dict(_KDA_UNIT_STRIDES, STRIDE_K=KDA_DIM, BLOCK_K=block_k, BLOCK_V=block_v, L2NORM=True,
             EVEN=block_k == KDA_DIM and KDA_DIM % block_v == 0, FUSED_OUTPUT=bool(cfg.get("fused_output")),
             STREAM=bool(cfg.get("stream_state"))),
        dict(_KDA_INPUTS, out_ptr="bf16", state_ptr="fp32", ids_ptr="i32"), floats=("scale",),
        num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages") or 3,
        divisible=multiples_of_16(H=KDA_HEADS, K=KDA_DIM, V=KDA_DIM))


def _triton_type(dtype) -> str:
    """A torch dtype's name as a Triton pointer element type."""
    import torch

    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8e4nv",
             torch.uint8: "u8", torch.uint16: "u16", torch.int32: "i32"}
    if dtype not in names:
        raise ValueError(f"aot: no Triton pointer type for {dtype}; expected one of {sorted(map(str, names))}")
    return names[dtype]


def _default_stages() -> int:
    """Triton's ``num_stages`` for a launch that passes none (the KDA prefill launchers)."""
    from triton.backends.nvidia.compiler import CUDAOptions

    return CUDAOptions.num_stages


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsahal.backends.nvidia.aot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="compile only variants whose name contains one of these")
    parser.add_argument("--sass", action="store_true",
                        help="also print the SASS opcode counts of each kernel's main loop, by class")
    parser.add_argument("--invariant", action="store_true",
                        help="also compile each variant as batch-invariant mode does (its twin: the facts of the "
                             "cache's and the launcher-aligned arguments only)")
    parser.add_argument("--list", action="store_true", help="print the variants' names (what --only matches), compile "
                                                             "nothing")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("triton") is None:
        print("error: Triton is not installed (pip install 'dsahal[test]')", file=sys.stderr)
        return 2
    chosen = [v for v in variants() if not args.only or any(t in v.name for t in args.only)]
    if not chosen:
        print(f"error: --only {' '.join(args.only)}: no variant name contains any of these "
              f"(python -m dsahal.backends.nvidia.aot --list names them)", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(v.name for v in chosen))
        return 0
    width = max(58, *(len(v.name) for v in chosen))
    print(f"{'variant':<{width}} {'warps':>5} {'stages':>6} {'compile s':>9} {'regs':>5} {'stack B':>7} {'smem KB':>7}")
    if args.invariant:
        chosen = [v for variant in chosen for v in (variant, invariant_twin(variant)) if v is not None]
        width = max(width, *(len(v.name) for v in chosen))
    sass_of = {}  # a variant's name -> its SASS instructions (with --invariant: its twin is compared with it)
    for variant in chosen:
        result = compile_variant(variant)
        if result.error:
            print(f"{variant.name:<{width}} {variant.num_warps:>5} {variant.num_stages:>6} {result.seconds:>9.1f}  "
                  f"{result.error}")
        else:
            print(f"{variant.name:<{width}} {variant.num_warps:>5} {variant.num_stages:>6} {result.seconds:>9.1f} "
                  f"{result.registers:>5} {result.stack_bytes:>7} {result.shared_bytes / 1024:>7.1f}")
            sass = _cuobjdump(result.cubin, "-sass") if args.sass or args.invariant else ""
            if args.sass:
                print(format_profile(loop_profile(sass)))
            if args.invariant:
                sass_of[variant.name] = sass_instructions(sass)
                base = variant.name.removesuffix(TWIN_SUFFIX)
                if base != variant.name and base in sass_of:
                    print(f"    {same_sass_verdict(sass_of[base], sass_of[variant.name])}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
