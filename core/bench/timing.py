"""Timing: the median of CUDA-event timed runs after warm-up, and the two ceilings of docs/performance.md."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch


def time_ms(fn, *, warmup_ms: float = 25.0, rep_ms: float = 100.0) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA device (L2 flushed before each run)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def time_ms_graph(fn, *, replays: int = 20) -> float:
    """Median milliseconds of one replay of ``fn`` captured in a CUDA graph (launch gaps removed)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up on a side stream compiles kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@dataclass(frozen=True)
class Ceilings:
    copy_tbps: float  # device-to-device copy, bytes read + written per second, TB/s
    matmul_tflops: float  # bf16 8192³ matmul, TFLOP/s


def measure_ceilings(device="cuda", copy_bytes: int = 2 << 30, matmul_n: int = 8192) -> Ceilings:
    """Measure the copy and bf16 matmul ceilings now, on random data (never zeros)."""
    src = torch.randint(0, 255, (copy_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    a = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16)
    b = torch.randn(matmul_n, matmul_n, device=device, dtype=torch.bfloat16)
    mm_ms = time_ms(lambda: a @ b)
    return Ceilings(copy_tbps=2 * copy_bytes / copy_ms / 1e9, matmul_tflops=2 * matmul_n**3 / mm_ms / 1e9)


def time_ms_host(fn, *, warmup: int = 1, reps: int = 5) -> float:
    """Median wall-clock milliseconds of ``fn()`` on the host (``dsahal bench --quick`` on the CPU):
    ``warmup`` untimed calls, then ``reps`` timed ones."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
