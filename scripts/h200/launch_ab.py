"""The eager k31-pro-slice decode step with the launch cache on and off, interleaved in one process (issue 16).

Usage (on the H200, from the repository with dsahal importable)::

    python3 scripts/h200/launch_ab.py [--rounds 9]

The step is ``dsahal bench --op model``'s (:func:`dsahal.bench.model_step.decode_setup`: 64 requests at 4K,
bf16, every op with ``check=False``), run with the model's fused elementwise kernels (the CUDA-graph path's
step; ``model_launches.py``'s default) and with the torch chains (eager ``dsahal run``'s step). Each round
times each path with every :class:`dsahal.kernel_launch.LaunchedKernel` on, then off (Triton's own launch),
so a drift of the host's speed shifts both alike; medians of the rounds. Correctness first: the logits of
the step with the cache on equal those with it off, bit for bit, and the cache served the launches.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import timing  # scripts/h200/timing.py
from script_cli import CheckError, run  # scripts/h200/script_cli.py


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args(argv)
    import torch
    import triton

    from dsahal import kernel_launch
    from dsahal.bench.model_step import decode_setup
    from dsahal.config import load_config
    from dsahal.model import fused
    from dsahal.registry import use_backend

    if not torch.cuda.is_available():
        raise CheckError("launch_ab: needs a CUDA device")
    print(f"device {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    torch.manual_seed(0)
    started = time.time()
    results = {}
    with use_backend("nvidia"):
        setup = decode_setup(load_config("k31-pro-slice"), [args.context] * args.requests, "cuda")
        pool = setup.cache.pool.clone()

        def switch(on: bool):
            for wrapper in kernel_launch.installed().values():
                wrapper.enabled = on

        for path_name, path in (("fused kernels", fused.enabled), ("torch chains", fused.disabled)):
            with path():
                logits = {}
                for on in (False, True):
                    switch(on)
                    setup.cache.pool.copy_(pool)
                    setup.step()  # warm-up: compiles
                    setup.cache.pool.copy_(pool)
                    logits[on] = setup.step().clone()
                if not torch.equal(logits[False], logits[True]):
                    raise CheckError(f"{path_name}: the step's logits differ with the cache on and off")
                served = sum(w.stats()["cached_calls"] for w in kernel_launch.installed().values())
                samples = {False: [], True: []}
                for _ in range(args.rounds):
                    for on in (False, True):
                        switch(on)
                        samples[on].append(timing.bench_ms(setup.step, "cuda", warmup=5, rep=40))
                off, on_ = statistics.median(samples[False]), statistics.median(samples[True])
                results[path_name] = (off, on_, served)
                print(f"{path_name}: logits equal with the cache on and off; cached launches so far {served}",
                      flush=True)
        switch(True)
    wrappers = kernel_launch.installed()
    print(f"\n{len(wrappers)} launched kernels behind the cache in this process; {args.rounds} interleaved rounds")
    print("\n| eager step, 64 requests at 4K | Triton's launch ms | launch cache ms | saved |\n| --- | ---: | ---: | ---: |")
    for name, (off, on_, _) in results.items():
        print(f"| {name} | {off:.3f} | {on_:.3f} | {off - on_:+.3f} ms ({(off - on_) / off:.1%}) |")
    print(f"\ntotal {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    run("launch_ab", main)
