"""Run dsahal's chunked KDA prefill at 8 x 4096 tokens (32 heads, K = V = 128, bf16 inputs) a few times per
operand mode, for Nsight Compute to profile its two passes::

    ncu --clock-control none -k regex:kda_chunk --launch-skip 4 --launch-count 4 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        python3 scripts/h200/kda_chunk_ncu.py [MODE ...]

Each mode runs three calls (the first compiles); modes default to ``tf32 bf16``. Prints nothing but the modes'
order, so ncu's report is the output.
"""
import sys

import torch

from dsahal.backends.triton_kernels import kda_chunk


def main(modes):
    gen = torch.Generator(device="cuda").manual_seed(0)
    tokens, heads, dim = 8 * 4096, 32, 128
    q, k, v = (torch.randn(tokens, heads, dim, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(3))
    g = -0.02 - 0.3 * torch.rand(tokens, heads, dim, device="cuda", generator=gen)
    beta = torch.rand(tokens, heads, device="cuda", generator=gen).to(torch.bfloat16)
    cu = torch.arange(0, tokens + 1, 4096, dtype=torch.int32, device="cuda")
    pool = torch.zeros(8, heads, dim, dim, device="cuda")
    ids = torch.arange(8, dtype=torch.int32, device="cuda")
    for mode in modes:
        print("mode", mode, flush=True)
        for _ in range(3):
            kda_chunk.kda_prefill_chunked(q, k, v, g, beta, cu, pool, ids, dim ** -0.5, True, operands=mode,
                                          num_stages=3)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:] or ["tf32", "bf16"])
