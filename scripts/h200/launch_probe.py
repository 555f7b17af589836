"""Where a Triton launch's host time goes, and what the launch cache saves (issue 16, item 4).

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/launch_probe.py

One tiny ``lse_combine`` launch (``[2, 4, 16, 512]``: the GPU work is a few microseconds), per-call host time
(batches of calls, the device synchronised after each batch, rounds interleaved, medians) of:

- Triton's own ``kernel[grid](...)`` and the launch cache's (:mod:`dsahal.kernel_launch`),
  after checking that both write the same bits on fresh random inputs;
- the pieces: the cache's key, Triton's binder (3.6: ``device_caches[device][4]``), the compiled kernel's
  launcher called directly, torch's current device and stream, one ``torch.empty``;
- ``dsahal.ops.lse_combine(check=False)`` with every wrapper of the package on, then off;

then a cProfile of Triton's own launch (the top functions by own time). Well under a minute.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys

from script_cli import CheckError, run  # scripts/h200/script_cli.py
from timing import per_call_us  # scripts/h200/timing.py


def main() -> int:
    import torch
    import triton

    from dsahal import ops
    from dsahal import kernel_launch as launcher
    from dsahal.backends.triton_kernels import lse_combine as module

    assert torch.cuda.is_available(), "needs a GPU"
    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    wrapper = module.lse_combine_kernel
    if not isinstance(wrapper, launcher.LaunchedKernel):
        raise CheckError(f"lse_combine_kernel is not behind the launch cache ({type(wrapper).__name__})")
    jit = launcher.triton_launch(wrapper)
    gen = torch.Generator(device="cpu").manual_seed(1)
    o_parts = torch.randn((2, 4, 16, 512), generator=gen).to(device)
    lse_parts = torch.randn((2, 4, 16), generator=gen).to(device)
    out_a, lse_a = torch.empty((4, 16, 512), device=device), torch.empty((4, 16), device=device)
    out_b, lse_b = torch.empty_like(out_a), torch.empty_like(lse_a)
    grid, args_a = module._launch_args(o_parts, lse_parts, out_a, lse_a)
    _, args_b = module._launch_args(o_parts, lse_parts, out_b, lse_b)
    meta = dict(BLOCK_W=module._block_w(2), BLOCK_D=module._block_d(512, 512), num_warps=4)

    # correctness first: the same bits both ways, on two fresh inputs (the second a cache hit)
    for trial in range(2):
        o_parts.normal_()
        lse_parts.normal_()
        jit[grid](*args_a, **meta)
        wrapper[grid](*args_b, **meta)
        torch.cuda.synchronize()
        if not (torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)):
            raise CheckError(f"trial {trial}: the cached launch wrote other bits than Triton's own")
    stats = wrapper.stats()
    print(f"bitwise equal on fresh inputs; cache {stats}")
    if stats["cached_calls"] < 1:
        raise CheckError(f"the second launch was not served from the cache: {stats}")

    entry = next(iter(wrapper.compiled.values()))
    key = wrapper._key(args_b, meta)
    dev = torch.cuda.current_device()
    stream = launcher._current_stream(dev)
    binder = jit.device_caches[dev][4]
    direct = entry.direct
    print(f"direct launcher path: {direct is not None}; launcher {type(entry.run).__name__}")
    layers = {
        "Triton kernel[grid](...)": lambda: jit[grid](*args_a, **meta),
        "launch cache kernel[grid](...)": lambda: wrapper[grid](*args_b, **meta),
        "  cache key + lookup": lambda: wrapper.compiled.get(wrapper._key(args_b, meta)),
        "  Triton binder (3.6)": lambda: binder(*args_a, **meta),
        "  compiled.run(...) (CudaLauncher)": lambda: entry.run(grid[0], 1, 1, stream, entry.function, entry.metadata,
                                                                None, None, None, *args_b, *entry.tail),
        "  torch.cuda.current_device()": torch.cuda.current_device,
        "  raw current stream": lambda: launcher._current_stream(dev),
        "torch.empty((4, 16), device)": lambda: torch.empty((4, 16), device=device),
    }
    if direct is not None:
        layers["  launcher's C launch, direct"] = lambda: direct(
            grid[0], 1, 1, stream, entry.function, entry.cooperative, entry.pdl, None, None, entry.metadata, None,
            None, None, *args_b, *entry.tail)
    times = per_call_us(layers, torch.cuda.synchronize)
    print("\n| layer | µs/call |\n| --- | ---: |")
    for name, us in times.items():
        print(f"| {name} | {us:.2f} |")
    del key

    wrappers = list(launcher.installed().values())

    def op_with(enabled: bool):
        def call():
            for w in wrappers:
                w.enabled = enabled
            return ops.lse_combine(o_parts, lse_parts, check=False)
        return call

    on, off = op_with(True), op_with(False)
    ref = off()
    got = on()
    torch.cuda.synchronize()
    if not (torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])):
        raise CheckError("ops.lse_combine: the cached launch gave other bits")
    flip = per_call_us({"ops.lse_combine(check=False), cache on": on, "ops.lse_combine(check=False), cache off": off},
                       torch.cuda.synchronize)
    for name, us in flip.items():
        print(f"| {name} (includes toggling {len(wrappers)} wrappers) | {us:.2f} |")
    for w in wrappers:
        w.enabled = True

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3000):
        jit[grid](*args_a, **meta)
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    print("\ncProfile, 3000 launches of Triton's own kernel[grid](...):")
    print("\n".join(text.getvalue().splitlines()[:40]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    run("launch_probe", main)
