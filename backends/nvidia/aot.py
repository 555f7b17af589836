"""Compile the shared Triton kernels for Hopper (sm_90) without a GPU: compile time and resources.

``python -m dsahal.backends.nvidia.aot [--only NAME...]`` compiles the variants the NVIDIA backend launches —
the tuned fast paths and the exact fp32 paths the conformance suite draws — through Triton's
ahead-of-time API and the ``ptxas``/``cuobjdump`` that ship in Triton's wheel, and prints per
variant the compile seconds, registers per thread, stack bytes (spills land there) and shared
memory. It needs no device, so a developer on a CPU machine can see a variant that would keep
``ptxas`` busy for minutes or spill before spending GPU time: the exact fp32 path of the v3 indexer
took 403 s to compile here (it unrolled a [64 keys, 8 tokens x 32 heads] FMA dot four times) and
stalled the H200 conformance run of 2026-11-29.

Numbers come from the local Triton, which may be newer than a GPU machine's: read them as a guide,
not as the device's (the GPU's own figures come from ``python -m dsahal.backends.nvidia.tune``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HOPPER = ("cuda", 90, 32)  # backend, compute capability, warp size


@dataclass(frozen=True)
class Variant:
    """One compilation: ``kernel`` (a ``@triton.jit`` function) with these constexprs and pointer types.

    ``pointers``: element type per pointer argument (Triton names: ``fp32``, ``bf16``, ``fp8e4nv``,
    ``u8``, ``i32``...); every other non-constexpr argument is an ``i32`` scalar except ``floats``.
    """

    name: str
    kernel: object
    constexprs: dict
    pointers: dict
    floats: tuple = ()
    num_warps: int = 4
    num_stages: int = 1
    notes: str = field(default="", compare=False)
    # Integer arguments a launch passes as multiples of 16, beyond the default (every pointer, and every
    # ``stride*`` argument the kernel specialises): what Triton's run-time specialisation tells the compiler.
    divisible: tuple = ()

    def signature(self) -> dict:
        sig = {}
        for arg in self.kernel.arg_names:
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


def run_time_alignment(variant: Variant) -> dict:
    """The divisibility facts a launch on allocator-aligned tensors gives Triton: every pointer 16-byte
    aligned, and the ``stride*`` integers (and ``variant.divisible``) multiples of 16 unless the kernel
    declares them ``do_not_specialize``. Without them the compile models unaligned launches: scalar loads,
    a 64-bit address per row, registers and spills a serving launch does not have."""
    skip = {p.name for p in variant.kernel.params if p.do_not_specialize}
    facts = {}
    for index, arg in enumerate(variant.kernel.arg_names):
        if arg in variant.constexprs or arg in variant.floats or arg in skip:
            continue
        if arg in variant.pointers or arg.startswith("stride") or arg in variant.divisible:
            facts[(index,)] = [["tt.divisibility", 16]]
    return facts


def compile_variant(variant: Variant) -> Compiled:
    """Compile for sm_90 and read the resources from the cubin (no driver needed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=variant.kernel, signature=variant.signature(), constexprs=variant.constexprs,
                       attrs=run_time_alignment(variant))
    start = time.perf_counter()
    try:
        kernel = triton.compile(source, target=GPUTarget(*HOPPER),
                                options=dict(num_warps=variant.num_warps, num_stages=variant.num_stages))
    except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at compile time: report, go on
        return Compiled(variant, time.perf_counter() - start, None, None, None, f"{type(exc).__name__}: {exc}"[:200])
    seconds = time.perf_counter() - start
    registers, stack = _cubin_resources(kernel.asm["cubin"])
    return Compiled(variant, seconds, registers, stack, int(kernel.metadata.shared))


def _cubin_resources(cubin: bytes) -> tuple[int | None, int | None]:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        out = subprocess.run([tool, "-res-usage", handle.name], capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def variants() -> list[Variant]:
    """The launches of the NVIDIA backend worth watching, built from its own configuration code."""
    import torch

    from ..triton_kernels import indexer, kda, sparse_mla, topk, topk_split
    from ..triton_kernels.bytes import LATENT_CODES
    from . import config

    out = []
    index_ptrs = dict(w_ptr="fp32", pages_u8="u8", pages_u16="u16", pages_f32="fp32", block_table_ptr="i32",
                      req_ptr="i32", pos_ptr="i32", run_offset_ptr="i32", out_ptr="fp32")
    for label, q_type, dot, q_dtype in (("fp8 q", "fp8e4nv", indexer.DOT_FP8, torch.float8_e4m3fn),
                                        ("bf16 q", "bf16", indexer.DOT_BF16, torch.bfloat16),
                                        ("fp32 q (exact)", "fp32", indexer.DOT_FP32, torch.float32)):
        cfg = dict(config.indexer_config(32, q_dtype, "fp8"))
        block_h, cfg["block_n"], cfg["group"], cfg["tiles"] = indexer.tile_shape(32, dot, cfg["block_n"], cfg["group"],
                                                                                 cfg["tiles"])
        pipelined = [(cfg.get("pipeline", False), cfg["tiles"], cfg["num_stages"])]  # the backend's choice first
        if dot == indexer.DOT_FP8:  # the pipelined loop over fp8-typed keys, as the tune sweep runs it
            pipelined += [p for p in ((True, 16, 2), (True, 16, 3)) if p != pipelined[0]]
        variants = [(p, False) for p in pipelined] + [(p, True) for p in pipelined if p[0]]
        for (pipeline, tiles, stages), keys_as_b in variants:
            pointers = dict(index_ptrs, q_ptr=q_type, pages_u8="fp8e4nv" if pipeline else "u8")
            out.append(Variant(
                f"indexer fp8 keys, {label}, 32 heads" + (f", pipelined x{tiles}" if pipeline else "")
                + (", keys as B" if keys_as_b else ""),
                indexer.indexer_score_kernel,
                dict(FMT=1, DOT=dot, TOKEN_BYTES=132, BLOCK_H=block_h, BLOCK_N=cfg["block_n"], GROUP=cfg["group"],
                     TILES=tiles, ALIGNED=True, PIPELINE=pipeline, KEYS_AS_B=keys_as_b,
                     ONE_BLOCK=cfg.get("one_block_tiles", True) and cfg["block_n"] == 64),
                pointers, num_warps=cfg["num_warps"], num_stages=stages))
    mla_ptrs = dict(pages_u8="u8", pages_u16="u16", pages_f32="fp32", slots_ptr="i32", kv_scale_ptr="fp32",
                    o_ptr="fp32", lse_ptr="fp32")
    for heads, fmt, q_dtype, v_split in ((128, "bf16", torch.bfloat16, 1), (128, "bf16", torch.bfloat16, 2),
                                         (128, "fp8", torch.bfloat16, 1), (128, "fp8", torch.bfloat16, 2),
                                         (16, "bf16", torch.bfloat16, 1), (128, "bf16", torch.float32, 1),
                                         (4, "fp8_ds_mla", torch.float32, 1)):
        cfg = config.sparse_mla_config(320, heads, 2048, fmt, q_dtype)
        as_bf16 = q_dtype == torch.bfloat16
        pointers = dict(mla_ptrs, q_ptr="bf16" if as_bf16 else "fp32")
        if as_bf16 and fmt == "bf16":
            pointers["pages_u16"] = "bf16"  # the launcher's bf16 view
        out.append(Variant(
            f"sparse MLA {fmt} latents, {'bf16' if as_bf16 else 'fp32 (exact)'} q, H={heads}"
            + (f", values split {v_split} ways" if v_split > 1 else ""),
            sparse_mla.sparse_mla_kernel,
            dict(FMT=LATENT_CODES[fmt], AS_BF16=as_bf16, BLOCK_H=cfg["block_h"], BLOCK_N=cfg["block_n"], ALIGNED=True,
                 V_SPLIT=v_split),
            pointers, floats=("logit_scale",), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]))
    cfg = config.topk_config(4096)  # the one-program radix kernel (short rows; see config.topk_config)
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
            f"top-k split rows: {kernel.__name__}", kernel,
            dict(extra, ROW_LEVELS=cfg["row_levels"], CHUNK=cfg["chunk"]),
            {name: kind for name, kind in split_ptrs.items() if name in kernel.arg_names}, num_warps=cfg["num_warps"]))
    cfg = config.kda_prefill_config(128)
    out.append(Variant(
        "KDA recurrent step (token-by-token prefill)", kda.kda_recurrent_kernel,
        dict(BLOCK_K=128, BLOCK_V=cfg["block_v"], VARLEN=False, L2NORM=True, ZERO_PADDING_OUTPUT=True),
        dict(q_ptr="bf16", k_ptr="bf16", v_ptr="bf16", g_ptr="fp32", beta_ptr="bf16", out_ptr="bf16",
             state_ptr="fp32", ids_ptr="i32", cu_ptr="i32"), floats=("scale",), num_warps=cfg["num_warps"]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsahal.backends.nvidia.aot",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                        help="compile only variants whose name contains one of these")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("triton") is None:
        print("error: Triton is not installed (pip install 'dsahal[test]')", file=sys.stderr)
        return 2
    chosen = [v for v in variants() if not args.only or any(t in v.name for t in args.only)]
    print(f"{'variant':<58} {'warps':>5} {'stages':>6} {'compile s':>9} {'regs':>5} {'stack B':>7} {'smem KB':>7}")
    for variant in chosen:
        result = compile_variant(variant)
        if result.error:
            print(f"{variant.name:<58} {variant.num_warps:>5} {variant.num_stages:>6} {result.seconds:>9.1f}  "
                  f"{result.error}")
        else:
            print(f"{variant.name:<58} {variant.num_warps:>5} {variant.num_stages:>6} {result.seconds:>9.1f} "
                  f"{result.registers:>5} {result.stack_bytes:>7} {result.shared_bytes / 1024:>7.1f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
