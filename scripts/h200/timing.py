"""Timing shared by the H200 scripts of this folder: a median over CUDA events, and the copy ceiling
measured in the same run. On ``device="cpu"`` (the scripts' ``--cpu-smoke`` runs under the Triton
interpreter) one call is timed by the wall clock: the run exercises the script and measures nothing."""
import time


def bench_ms(fn, device: str, *, warmup: int = 10, rep: int = 60) -> float:
    if device == "cpu":
        started = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - started)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


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
