"""Timing shared by the H200 scripts of this folder: a median over CUDA events, and the copy ceiling
measured in the same run. On ``device="cpu"`` (the scripts' ``--cpu-smoke`` runs under the Triton
interpreter) one call is timed by the wall clock: the run exercises the script and measures nothing."""
import statistics
import time


def per_call_us(fns: dict, sync, calls: int = 2000, rounds: int = 15, warmup: int = 200) -> dict:
    """Per call host-and-launch time of each of ``fns`` (name -> function), in microseconds: the median over
    ``rounds`` interleaved rounds of ``calls`` back-to-back calls, then ``sync`` (``torch.cuda.synchronize``, or a
    no-op to time the Python and launch cost alone while the launch queue has room)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_ms(fn, device: str, *, warmup: int = 10, rep: int = 60) -> float:
    if device == "cpu":
        started = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - started)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def captured(torch, fn):
    """``fn`` captured once in a CUDA graph (after three warm-up calls on a side stream): the graph, whose
    ``replay`` times the call's GPU work alone."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def copy_ceiling_tbps(torch, device: str, *, smoke_bytes: int = 1 << 20) -> float:
    """Bytes read plus written per second by a 1 GiB device-to-device copy (``smoke_bytes`` on the CPU)."""
    size = 1 << 30 if device == "cuda" else smoke_bytes
    src = torch.empty(size, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), device)
    del src, dst
    return 2 * size / (ms * 1e-3) / 1e12


def announce(torch, triton, device: str) -> float:
    """Print the run's device line and the copy ceiling measured now; return the ceiling (TB/s)."""
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter smoke run)"
    print(f"device {name}  torch {torch.__version__}  triton {triton.__version__}")
    ceiling = copy_ceiling_tbps(torch, device)
    print(f"copy ceiling {ceiling:.2f} TB/s (read + write)", flush=True)
    return ceiling
