"""Host time of one Gluon kernel launch (the wgmma few-heads sparse MLA at 8 and 64 tokens, H = 16): Triton's own
launch against the launch cache (``dsahal.kernel_launch.LaunchedKernel``), outputs compared bit for bit, and the GPU
time of the same call replayed from a CUDA graph; FlashMLA's call (heads padded to 64) beside it.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/gluon_launch.py
"""
from __future__ import annotations

import time

import pools as cache_pools  # scripts/h200/pools.py
from script_cli import finish, run  # scripts/h200/script_cli.py


def host_us(torch, fn, calls=300):
    """Wall time per call of ``calls`` back-to-back calls (the GPU keeps up at these sizes: host-bound)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) / calls * 1e6
    torch.cuda.synchronize()
    return host


def graph_us(torch, fn, replays=200):
    """GPU time per call, replayed from a CUDA graph (no host work)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / replays * 1e3


def main(argv=None) -> int:
    import torch

    from dsahal.backends.triton_kernels import sparse_mla_wgmma as w
    from dsahal.kernel_launch import LaunchedKernel, triton_launch

    started = time.time()
    failures = []
    pages = cache_pools.latent_pools(torch, ("fp8_ds_mla",), 1 << 18, "cuda")["fp8_ds_mla"][0]
    cached_kernel = w.sparse_mla_wgmma_kernel
    plain_kernel = triton_launch(cached_kernel)  # (the module wraps it in the launch cache)
    for tokens, split in ((8, 128), (64, 256), (320, 1024)):
        q = torch.randn(tokens, 16, 576, device="cuda").to(torch.bfloat16)
        slots = torch.randint(0, pages.shape[0] * 64, (tokens, 2048), device="cuda", dtype=torch.int32)
        call = (lambda: w.sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, 0.07, split_size=split))
        w.sparse_mla_wgmma_kernel = plain_kernel
        o1, lse1 = call()
        triton_host = host_us(torch, call)
        w.sparse_mla_wgmma_kernel = LaunchedKernel(plain_kernel, True)  # a fresh cache (compiles nothing new)
        o2, lse2 = call()
        cached_host = host_us(torch, call)
        gpu = graph_us(torch, call)
        same = bool(torch.equal(o1, o2) and torch.equal(lse1, lse2))
        line = (f"T={tokens:<4d} split {split:<5d} host per call: Triton's launch {triton_host:7.1f} us, launch cache "
                f"{cached_host:7.1f} us; GPU (graph replay) {gpu:7.1f} us; outputs equal: {same}")
        try:
            import flash_mla as fm

            qp = torch.zeros(tokens, 64, 576, dtype=q.dtype, device="cuda")
            qp[:, :16] = q
            meta, _ = fm.get_mla_metadata()
            peer = (lambda: fm.flash_mla_with_kvcache(qp.view(tokens, 1, 64, 576), pages.view(-1, 64, 1, 656), None,
                                                      None, 512, meta, softmax_scale=0.07, is_fp8_kvcache=True,
                                                      indices=slots.view(tokens, 1, 2048), use_legacy=True,
                                                      kv_format="V32"))
            line += f"; FlashMLA host {host_us(torch, peer):7.1f} us, GPU {graph_us(torch, peer):7.1f} us"
        except Exception as exc:  # noqa: BLE001 - the peer is optional
            line += f"; FlashMLA: {type(exc).__name__}: {str(exc)[:80]}"
        print(line, flush=True)
        if not same:
            failures.append(f"T={tokens}: the launch cache's outputs differ from Triton's launch")
    w.sparse_mla_wgmma_kernel = cached_kernel
    return finish("gluon_launch", failures, started, "case(s) differ")


if __name__ == "__main__":
    run("gluon_launch", main)
