"""Whether a kernel's computation changed between two commits, by its compiled dataflow, on a CPU machine
(``python -m dsahal.backends.nvidia.dataflow --base REV [--only TEXT]``).

A refactor of a certified kernel (code moved into functions, loops restructured around it) should leave what it
computes alone, but its SASS can still differ: the IR's op order steers ptxas's scheduling and register allocation.
This compiles each launch of :mod:`.aot` (sm_90, no driver) twice, from this checkout and with its kernel module as
it was at ``REV`` (``git show``; the module's package siblings from this checkout, options the old kernel does not
declare left out), and compares the two Triton GPU IRs as dataflow graphs: every op hashed with its operands' hashes
(SSA names, source locations and the order of independent ops dropped; loop-carried values and region arguments by
position, the kernel's arguments by name, region ops with their bodies). Equal multisets: the same operations on the same operands, so the same
results given the same inputs; a difference names the ops only one side has. Used in the fortieth session on the
wgmma kernels' fixed launches, whose SASS differed from the GPU-certified one in integer instruction selection only.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import importlib.util
import re
import subprocess
import sys

_NAME = r"%[\w$.\-]+(?:#\d+)?"
_LOC = re.compile(r" ?loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")
_FOR = re.compile(rf"scf\.for ({_NAME}) = ({_NAME}) to ({_NAME}) step ({_NAME})(?: iter_args\((.*?)\))?")


def _h(*parts) -> str:
    return hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest()[:16]


def dataflow(ttgir: str) -> collections.Counter:
    """The multiset of op hashes of a ``tt.func``'s TTGIR text (the first function in it)."""
    lines = [_LOC.sub("", line).rstrip() for line in ttgir.splitlines()]
    start = next(i for i, line in enumerate(lines) if "tt.func" in line)
    value = {name: _h("argument", name) for name in re.findall(r"(%[\w$.\-]+): ", lines[start])}  # (by name)
    ops: collections.Counter = collections.Counter()
    regions = []  # open region ops: (result names, header hash, the hashes inside)

    def named(text: str) -> str:
        def one(match):
            name = match.group(0)
            base, _, index = name.partition("#")
            if name in value:
                return "@" + value[name]
            if index and base in value:
                return "@" + _h(value[base], index)
            return "?"  # a value defined here (its own result)
        return re.sub(_NAME, one, text)

    def record(op_hash: str) -> None:
        ops[op_hash] += 1
        if regions:
            regions[-1][2].append(op_hash)

    for line in lines[start + 1:]:
        text = line.strip()
        if not text or text.startswith(("//", "#")):
            continue
        if text.startswith("}"):
            if text.startswith("} else {"):
                if regions:
                    regions[-1][2].append("else")
            elif regions:
                results, header, inside = regions.pop()
                body = _h(header, *sorted(inside))
                for k, result in enumerate(results):
                    value[result] = _h(body, k)
                record(body)
            continue
        if text.startswith("^bb"):  # a region's block arguments (a reduction's combiner): by position
            for k, name in enumerate(re.findall(r"(%[\w$.\-]+): ", text)):
                value[name] = _h("block argument", k)
            continue
        match = re.match(rf"^({_NAME}(?::\d+)?(?:, {_NAME})*) = (.*)$", text)
        lhs, rhs = (match.group(1), match.group(2)) if match else ("", text)
        multi = re.match(r"^(%[\w$.\-]+):\d+$", lhs)
        results = [multi.group(1)] if multi else [name.strip() for name in lhs.split(",") if name.strip()]
        if rhs.endswith("{"):  # a region op (scf.for / scf.if / a generic op with a region)
            loop = _FOR.match(rhs)
            header = _h(named(rhs))
            if loop:
                bounds = [named(loop.group(g)) for g in (2, 3, 4)]
                value[loop.group(1)] = _h("induction", *bounds)
                inits = []
                for k, pair in enumerate(loop.group(5).split(", ") if loop.group(5) else []):
                    name, _, init = pair.partition(" = ")
                    inits.append(named(init))
                    value[name] = _h("carried", k, inits[-1])
                header = _h("for", *bounds, *inits)
            regions.append((results, header, []))
            continue
        op_hash = _h(named(rhs))
        for k, result in enumerate(results):
            value[result] = _h(op_hash, k)
        record(op_hash)
    return ops


def _module_at(rev: str, module, folder: str):
    """``module`` (a kernel module of this package) as it was at ``rev``, importable beside today's siblings (its
    source written into ``folder``: Triton reads a kernel's source from its file)."""
    path = module.__file__[module.__file__.rindex("/backends/") + 1:]
    root = module.__file__[:module.__file__.rindex("/backends/")]
    source = subprocess.run(["git", "-C", root, "show", f"{rev}:{path}"], capture_output=True, text=True,
                            check=True).stdout
    name = module.__name__ + "_at_" + re.sub(r"\W", "_", rev)
    file = f"{folder}/{name.rsplit('.', 1)[1]}.py"
    with open(file, "w") as out:
        out.write(source)
    spec = importlib.util.spec_from_file_location(name, file)
    old = importlib.util.module_from_spec(spec)
    old.__package__ = module.__package__
    sys.modules[name] = old
    spec.loader.exec_module(old)
    return old


def _ttgir(variant, kernel=None) -> str:
    """``variant`` compiled for sm_90 (:func:`.aot.compile_variant`; or the same launch of ``kernel``, the options it
    does not declare left out): its TTGIR text."""
    import dataclasses

    from . import aot

    if kernel is not None:
        declared = _declared(kernel)
        variant = dataclasses.replace(variant, kernel=kernel,
                                      constexprs={k: v for k, v in variant.constexprs.items() if k in declared})
    compiled = aot.compile_variant(variant)
    if compiled.error:
        raise RuntimeError(compiled.error)
    return compiled.ttgir


def _declared(kernel) -> set[str]:
    import inspect

    from . import aot

    return set(inspect.signature(aot.triton_launch(kernel).fn).parameters)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsahal.backends.nvidia.dataflow",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare against (e.g. a certified one)")
    parser.add_argument("--only", default="", help="only the launches whose name holds this text")
    args = parser.parse_args(argv)
    from . import aot

    chosen = [v for v in aot.variants() if args.only in v.name]
    if not chosen:
        print(f"error: no launch of dsahal.backends.nvidia.aot has {args.only!r} in its name", file=sys.stderr)
        return 2
    import tempfile

    differ = 0
    olds = {}
    with tempfile.TemporaryDirectory() as folder:
        for variant in chosen:
            differ += _compare(variant, args.base, olds, folder)
    return 1 if differ else 0


def _compare(variant, base: str, olds: dict, folder: str) -> bool:
    """Print whether ``variant`` computes what it did at ``base``; True where it differs (or cannot be compared)."""
    function = getattr(variant.kernel, "fn", variant.kernel)
    module = sys.modules[function.__module__]
    try:
        if module.__name__ not in olds:
            olds[module.__name__] = _module_at(base, module, folder)
        old_kernel = getattr(olds[module.__name__], function.__name__)
        missing = [k for k, v in variant.constexprs.items() if v and k not in _declared(old_kernel)]
        if missing:  # an option the old kernel predates, switched on: nothing to compare with
            print(f"{variant.name}: not comparable (the base kernel has no {', '.join(missing)})")
            return False
        now, then = dataflow(_ttgir(variant)), dataflow(_ttgir(variant, old_kernel))
    except Exception as exc:  # noqa: BLE001 - a launch the old module cannot compile: report, go on
        print(f"{variant.name}: not compared ({type(exc).__name__}: {str(exc)[:160]})")
        return True
    gone, new = sum((then - now).values()), sum((now - then).values())
    verdict = "the same dataflow" if not gone and not new else f"differs ({gone} ops only at the base, {new} only now)"
    print(f"{variant.name}: {verdict} ({sum(now.values())} ops)")
    return bool(gone or new)


if __name__ == "__main__":
    sys.exit(main())
