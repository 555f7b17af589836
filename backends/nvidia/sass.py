"""Reading a Hopper cubin without a GPU: ``cuobjdump`` (the one in Triton's wheel), the kernel's resources, and the
opcode counts of its main loop.

:mod:`.aot` compiles the NVIDIA backend's kernel variants and reads them through this module: registers and stack
bytes (:func:`cubin_resources`), the main loop's instructions by class (:func:`loop_profile`, the largest region a
backward branch closes: global / shared loads and stores with their widths, barriers, MMAs, conversions, byte
permutes, integer ALU, float, moves, other), and whether two compiles are the same code (:func:`sass_instructions`,
:func:`same_sass_verdict`: batch-invariant mode's compile against the default's).
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump <flag>`` of ``cubin`` (the one in Triton's wheel: no CUDA toolkit needed)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        proc = subprocess.run([tool, flag, handle.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cuobjdump {flag} failed (exit {proc.returncode}): {proc.stderr.strip()[:200]}")
    return proc.stdout


def cubin_resources(cubin: bytes) -> tuple[int | None, int | None]:
    """``(registers per thread, stack bytes)`` of the cubin's kernel (None, None when cuobjdump does not say)."""
    match = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(cubin, "-res-usage"))
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


# --- SASS of the main loop -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    """One SASS instruction (its predicate dropped)."""

    address: int
    opcode: str  # with its modifiers: "LDG.E.128", "IMAD.WIDE.U32"
    operands: str


# `        /*0d00*/              @!P4 BRA 0x3ef0 ;   /* 0x000000300078c947 */` (the encoding lines have no opcode)
_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P(?:T|\d)\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def parse_sass(text: str) -> list[Instruction]:
    """``cuobjdump -sass`` text -> its instructions in address order (one kernel per cubin)."""
    out = []
    for line in text.splitlines():
        match = _SASS_LINE.match(line)
        if match:
            out.append(Instruction(int(match.group(1), 16), match.group(2), match.group(3).strip()))
    return out


def main_loop(instructions: list[Instruction]) -> tuple[int, int] | None:
    """``(first, last)`` addresses of the region a backward branch closes (its target to the branch) that holds the
    most MMAs, the largest such, or None for straight-line code. Why: the kernels' key / slot / chunk loops hold the
    MMAs and loads; other backward branches close inner helper loops, the tail ``BRA`` to itself after ``EXIT``, or a
    block ptxas placed after the epilogue that jumps back into the loop (a larger region with fewer MMAs)."""
    best, best_key = None, None
    for ins in instructions:
        if not ins.opcode.startswith("BRA"):
            continue
        target = re.search(r"0x([0-9a-f]+)\s*$", ins.operands)
        if target is None:
            continue
        first = int(target.group(1), 16)
        if first >= ins.address:
            continue
        mmas = sum(1 for other in instructions if first <= other.address <= ins.address and "MMA" in other.opcode)
        key = (mmas, ins.address - first)
        if best_key is None or key > best_key:
            best, best_key = (first, ins.address), key
    return best


_WIDTHS = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128}
_INTEGER = {"IADD3", "IADD", "IADD32I", "IMAD", "IMUL", "LEA", "LOP3", "LOP", "SHF", "SHL", "SHR", "ISETP", "ICMP",
            "SEL", "IMNMX", "VIADD", "VIMNMX", "VIADDMNMX", "IABS", "SGXT", "BMSK", "POPC", "FLO", "BREV", "PLOP3",
            "P2R", "R2P", "IDP", "IDP4A"}
_FLOAT = {"FFMA", "FMUL", "FADD", "FMNMX", "FSEL", "FSETP", "FSET", "FCHK", "MUFU", "FRND", "FSWZADD", "HFMA2",
          "HMUL2", "HADD2", "HMNMX2", "HSETP2", "HSET2", "DFMA", "DMUL", "DADD"}
_MOVES = {"MOV", "MOV32I", "CS2R", "S2R", "S2UR", "R2UR", "LDC", "ULDC"}
_CONVERSIONS = {"F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP", "I2I", "I2IP"}
# Sections of the profile in print order (the --sass block and LoopProfile.classes use these names).
CLASSES = ("global", "shared", "barrier", "mma", "convert", "permute", "integer", "float", "move", "other")


def _width(opcode: str) -> int:
    """Bits a memory instruction moves per thread: ``LDG.E.128`` 128, ``LDG.E.U8`` 8, plain ``LDG.E`` 32."""
    for part in opcode.split(".")[1:]:
        if part in _WIDTHS:
            return _WIDTHS[part]
    return 32


def classify(opcode: str) -> tuple[str, str]:
    """``(class, label)`` of one opcode: the class one of :data:`CLASSES`; the label the base opcode, with the
    width for memory instructions (``LDG.128``, ``STS.32``). Uniform-datapath integer ops (``UIADD3``...)
    count as integer ALU under their own labels."""
    base = opcode.split(".")[0]
    if base in ("LDG", "STG", "LDGSTS", "ATOMG", "REDG", "RED", "ATOM"):
        return "global", f"{base}.{_width(opcode)}"
    if base in ("LDS", "STS", "LDSM", "STSM", "ATOMS"):
        return "shared", f"{base}.{_width(opcode)}" if base in ("LDS", "STS") else base
    if base in ("BAR", "DEPBAR", "LDGDEPBAR", "MEMBAR", "FENCE", "SYNCS", "WARPGROUP", "ARRIVES", "WARPSYNC",
                "ERRBAR", "CCTL"):
        return "barrier", base  # WARPGROUP: the wgmma fences and waits around each HGMMA
    if base.endswith("MMA"):  # HMMA, IMMA, DMMA, HGMMA, QGMMA, IGMMA, BGMMA
        return "mma", base
    if base in _CONVERSIONS:
        return "convert", base
    if base in ("PRMT", "UPRMT"):
        return "permute", base
    if base in _INTEGER or (base.startswith("U") and base[1:] in _INTEGER):
        return "integer", base
    if base in _FLOAT:
        return "float", base
    if base in _MOVES or base in ("UMOV", "SHFL"):  # SHFL: a move between lanes
        return "move", base
    return "other", base


@dataclass
class LoopProfile:
    """Opcode counts of one kernel's main loop. Subroutines the loop ``CALL``s (ptxas' division helpers) lie
    outside the region and are not counted: the ``CALL`` under ``other`` says they run."""

    first: int  # address of the loop's first instruction
    last: int  # address of its closing backward branch
    classes: dict  # class -> Counter(label -> count), classes in CLASSES order, empty ones left out
    kernel_instructions: int  # the whole kernel's (a small loop in a big kernel, e.g. a search, shows as such)

    @property
    def instructions(self) -> int:
        return sum(sum(counts.values()) for counts in self.classes.values())


def loop_profile(sass: str) -> LoopProfile | None:
    """Opcode counts of the main loop (:func:`main_loop`) of ``cuobjdump -sass`` text; None without a loop."""
    instructions = parse_sass(sass)
    bounds = main_loop(instructions)
    if bounds is None:
        return None
    counts = {name: collections.Counter() for name in CLASSES}
    for ins in instructions:
        if bounds[0] <= ins.address <= bounds[1]:
            kind, label = classify(ins.opcode)
            counts[kind][label] += 1
    return LoopProfile(bounds[0], bounds[1], {name: c for name, c in counts.items() if c}, len(instructions))


def format_profile(profile: LoopProfile | None, indent: str = "    ") -> str:
    """The --sass block: one line per class, its total then its opcodes by count."""
    if profile is None:
        return f"{indent}no backward branch: straight-line code"
    lines = [f"{indent}main loop 0x{profile.first:x}-0x{profile.last:x}: {profile.instructions} of the kernel's "
             f"{profile.kernel_instructions} instructions"]
    for name, counts in profile.classes.items():
        detail = ", ".join(f"{label} {n}" for label, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))
        lines.append(f"{indent}  {name:<8} {sum(counts.values()):>5}  {detail}")
    return "\n".join(lines)


def sass_instructions(sass: str) -> list[str]:
    """``cuobjdump -sass`` text as its instruction and encoding lines, their address markers dropped (two compiles
    compare equal when they would run the same code, predicates, operands and branch targets included)."""
    return [_ADDRESS.sub("", line).strip() for line in sass.splitlines() if "/*" in line and "Function" not in line]


_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")


def same_sass_verdict(default: list[str], twin: list[str]) -> str:
    """One line: whether batch-invariant mode's compile is the default compile's code."""
    if default == twin:
        return f"batch-invariant compile: the default compile's SASS ({len(default)} lines)"
    return f"batch-invariant compile DIFFERS: {len(twin)} SASS lines against the default's {len(default)}"
