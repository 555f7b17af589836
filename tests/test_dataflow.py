"""``dsahal.backends.nvidia.dataflow``: TTGIR compared as dataflow (what a refactor of a certified kernel is checked
with on a CPU machine). The texts below are TTGIR as Triton prints it, cut down: SSA names, source locations and the
order of independent ops must not matter; which value feeds which op must."""
from dsahal.backends.nvidia.dataflow import dataflow

KERNEL = """#loc = loc("x.py":1:0)
module attributes {"ttg.num-warps" = 4 : i32} {
  tt.func public @k(%x_ptr: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc))) {
    %c0_i32 = arith.constant 0 : i32 loc(#loc)
    %c1_i32 = arith.constant 1 : i32 loc(#loc)
    %cst = arith.constant 2.000000e+00 : f32 loc(#loc1)
    %cst_0 = arith.constant 0.000000e+00 : f32 loc(#loc1)
    %a = tt.load %x_ptr : !tt.ptr<f32> loc(#loc2)
    %b:2 = scf.for %i = %c0_i32 to %n step %c1_i32 iter_args(%s = %cst_0, %t = %a) -> (f32, f32)  : i32 {
      %p = arith.mulf %s, %cst : f32 loc(#loc3)
      %q = arith.subf %t, %p : f32 loc(#loc4)
      %m = "tt.reduce"(%q) <{axis = 0 : i32}> ({
      ^bb0(%u: f32 loc(callsite(#loc5 at #loc6)), %v: f32 loc(callsite(#loc5 at #loc6))):
        %w = arith.maxnumf %u, %v : f32 loc(#loc7)
        tt.reduce.return %w : f32 loc(#loc7)
      }) : (f32) -> f32 loc(#loc8)
      scf.yield %q, %m : f32, f32 loc(#loc9)
    } loc(#loc10)
    tt.store %x_ptr, %b#1 : !tt.ptr<f32> loc(#loc11)
    tt.return loc(#loc12)
  } loc(#loc)
} loc(#loc)
"""


def _renamed(text: str) -> str:
    """The same kernel with other SSA names, other locations and two independent constants swapped."""
    for old, new in (("%a ", "%first "), ("%a)", "%first)"), ("%p ", "%prod "), ("%p :", "%prod :"),
                     ("%q", "%diff"), ("%w", "%bigger"), ("%b:2", "%res:2"), ("%b#1", "%res#1"), ("#loc3", "#loc30")):
        text = text.replace(old, new)
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if "%cst = " in line)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    return "\n".join(lines)


def test_names_locations_and_independent_order_do_not_matter():
    renamed = _renamed(KERNEL)
    assert renamed != KERNEL and "%diff" in renamed and "%res#1" in renamed
    assert dataflow(renamed) == dataflow(KERNEL)


def test_an_operand_fed_from_elsewhere_differs():
    swapped = KERNEL.replace("%q = arith.subf %t, %p", "%q = arith.subf %p, %t")
    assert dataflow(swapped) != dataflow(KERNEL)


def test_carried_values_by_position_and_arguments_by_name():
    carried = KERNEL.replace("iter_args(%s = %cst_0, %t = %a)", "iter_args(%s = %a, %t = %cst_0)")
    assert dataflow(carried) != dataflow(KERNEL)
    assert dataflow(KERNEL.replace("%x_ptr", "%y_ptr")) != dataflow(KERNEL)  # another argument
    # a reduction's combiner: its block arguments by position
    assert dataflow(KERNEL.replace("arith.maxnumf %u, %v", "arith.maxnumf %v, %u")) != dataflow(KERNEL)


def test_a_region_ops_body_is_part_of_its_results():
    body = KERNEL.replace("%p = arith.mulf %s, %cst", "%p = arith.addf %s, %cst")
    assert dataflow(body) != dataflow(KERNEL)
