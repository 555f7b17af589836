"""Source rules for Triton kernels that the local Triton does not enforce but the H200's does.

Triton 3.6 (the H200's) hashes a JIT function's source dependencies by walking its AST; an assignment
that unpacks a nested tuple (``(a, b), c = x``) makes that walk raise ``TypeError: unhashable type:
'list'`` at the first launch of every kernel calling the function (seen on the H200, 2026-12-01, in the
block-tile indexer). Newer Tritons accept it, so only this scan catches it before a GPU run."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target) in ("triton.jit", "jit", "gluon.jit")


def _nested(target: ast.expr) -> bool:
    return isinstance(target, (ast.Tuple, ast.List)) and any(
        isinstance(e, (ast.Tuple, ast.List, ast.Starred)) for e in target.elts)


def test_no_triton_jit_function_unpacks_a_nested_tuple():
    found = []
    for path in sorted((ROOT / "backends").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not (isinstance(fn, ast.FunctionDef) and any(_is_triton_jit(d) for d in fn.decorator_list)):
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.For, ast.AugAssign, ast.AnnAssign)) else []
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(t)}" for t in targets if _nested(t)]
    assert not found, "nested tuple unpacking in Triton JIT code (Triton 3.6 fails on it): " + "; ".join(found)


def test_the_scan_sees_a_nested_unpacking():
    tree = ast.parse("@triton.jit\ndef k(x):\n    (a, b), c = x\n")
    fn = tree.body[0]
    assert _is_triton_jit(fn.decorator_list[0])
    assert _nested(fn.body[0].targets[0])
