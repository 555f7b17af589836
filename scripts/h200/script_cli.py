"""How the H200 scripts of this folder end: the failed checks listed, one ``error:`` line, exit status 1.

``CheckError`` is what a script raises for a failed check or a bad argument; :func:`finish` lists the
failures after the tables and raises it; :func:`run` calls a script's ``main`` and turns a ``CheckError``
(or any other exception: a CLI error is one line, never a traceback) into that line and status.
"""
import sys
import time


class CheckError(Exception):
    pass


def finish(name: str, failures: list, started: float, what: str = "check(s) failed") -> int:
    """After the tables: the total time, then each failure and a :class:`CheckError` naming the first."""
    print(f"\ntotal {time.time() - started:.0f} s")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        raise CheckError(f"{name}: {len(failures)} {what} (listed above), first: {failures[0][:300]}")
    return 0


def run(name: str, main) -> None:
    """``sys.exit(main())``, with any exception as one ``error:`` line and status 1."""
    try:
        sys.exit(main())
    except CheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - a CLI error is one line, never a traceback
        keep_traceback(name)
        print(f"error: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


def keep_traceback(name: str) -> None:
    """An unexpected exception's traceback goes to ``$OUT/traceback-<name>.txt`` (the device call's output
    folder), not to the console, so a failed run can be diagnosed without a second device call."""
    import os
    import traceback

    folder = os.environ.get("OUT")
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"traceback-{name}.txt"), "w") as f:
            traceback.print_exc(file=f)


def smoke_args(description: str, argv=None):
    """The parsed ``--cpu-smoke`` flag of a sweep script (tiny shapes on the CPU under TRITON_INTERPRET=1, which
    is set here, before Triton is imported: every step runs, the times mean nothing)."""
    import argparse
    import os

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny shapes on the CPU under TRITON_INTERPRET=1: runs every step, the times mean nothing")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    return args


def start(name: str, device: str):
    """After :func:`smoke_args`: torch and Triton imported, a CUDA device required when ``device`` is
    ``"cuda"``, the device line and this run's copy ceiling printed -> (torch, triton, started, ceiling TB/s)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError(f"{name}: needs a CUDA device, none is visible (or pass --cpu-smoke)")
    import triton

    import timing  # scripts/h200/timing.py

    started = time.time()
    return torch, triton, started, timing.announce(torch, triton, device)


def edge_then_sweep(name: str, doc: str, edge_cases, sweep, argv=None, profile=None) -> int:
    """A check script's main: ``--pool-tokens`` and ``--no-sweep`` parsed, the device and copy ceiling printed, then
    ``edge_cases(torch, failures)`` and (unless ``--no-sweep``) ``sweep(torch, pool_tokens, ceiling TB/s, failures)``;
    the failures reported by :func:`finish`. With ``profile`` (``profile(torch, pool_tokens)``: a few launches, no
    checks, for Nsight Compute) the script also takes ``--profile``, which runs that alone."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--pool-tokens", type=int, default=1 << 20)
    parser.add_argument("--no-sweep", action="store_true", help="the edge cases only")
    if profile is not None:
        parser.add_argument("--profile", action="store_true",
                            help=f"no checks: {(profile.__doc__ or 'the launch to profile').strip()}")
    args = parser.parse_args(argv)
    import torch
    import triton

    import timing  # scripts/h200/timing.py

    if profile is not None and args.profile:
        profile(torch, args.pool_tokens)
        return 0

    started = time.time()
    failures = []
    ceiling = timing.announce(torch, triton, "cuda")
    edge_cases(torch, failures)
    if not args.no_sweep:
        sweep(torch, args.pool_tokens, ceiling, failures)
    return finish(name, failures, started, "case(s) differ from the reference")
