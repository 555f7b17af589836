"""The Gluon few-heads sparse MLA kernel (``sparse_mla_gluon``) against the float64 reference on the edge cases of a
CUDA run: 1, 12 and 16 heads, skipped (-1) and out-of-range slots, a row with no valid slot, splits with a partial
last one, per-record magnitudes 2^-6..2^6 (the running tile-scale maximum), a strided pool (blocks not back to back)
and 16-slot blocks. Prints one line per case; exits with one ``error:`` line when any case fails.

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/gluon_check.py
"""
from __future__ import annotations

from script_cli import CheckError, finish, run, start  # scripts/h200/script_cli.py

TOL_O, TOL_LSE = 1e-2, 1e-3


def main(argv=None) -> int:
    torch, triton, started, _ = start("gluon_check", "cuda")
    from dsahal.backends.triton_kernels.sparse_mla_gluon import sparse_mla_gluon
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    gen = torch.Generator().manual_seed(0)
    spec = latent_format("fp8_ds_mla")
    failures = []
    for heads, block_tokens, width, split, block_n, stages, strided, lazy, q_smem, wpt in (
            (16, 64, 2048, 512, 32, 3, False, True, False, 1), (12, 64, 300, 128, 32, 2, False, True, False, 1),
            (1, 16, 77, None, 16, 4, True, True, False, 1), (16, 16, 1000, 512, 64, 2, True, True, False, 1),
            (16, 64, 37, 16, 16, 3, False, True, False, 1), (16, 64, 2048, 512, 16, 4, False, False, False, 1),
            (12, 64, 700, None, 16, 4, True, False, True, 1), (16, 64, 2048, 512, 16, 3, False, True, True, 1),
            (16, 64, 2048, 512, 16, 3, False, True, False, 2), (12, 16, 300, None, 32, 2, True, False, True, 2),
            (1, 64, 40, 16, 16, 4, False, True, False, 2)):
        blocks = 40
        slots_n = blocks * block_tokens
        rows = torch.randn(slots_n, 576, generator=gen) * torch.exp2(torch.randint(-6, 7, (slots_n, 1), generator=gen))
        records = spec.pack(rows + 1e-3).view(blocks, block_tokens, 656)
        pages = records.clone()
        if strided:  # blocks 16 bytes further apart than their records (a view into a larger buffer, on the GPU)
            buf = torch.zeros(blocks, block_tokens * 656 + 16, dtype=torch.uint8, device="cuda")
            pages_gpu = buf[:, : block_tokens * 656].unflatten(1, (block_tokens, 656))
            pages_gpu.copy_(records.cuda())
            assert pages_gpu.stride(0) == block_tokens * 656 + 16
        else:
            pages_gpu = pages.cuda()
        tokens = 6
        slots = torch.randint(-1, slots_n, (tokens, width), generator=gen, dtype=torch.int32)
        slots[1, :3] = slots_n + 5  # past the pool: skipped
        slots[-1] = -1  # a row with no valid slot
        q = (torch.randn(tokens, heads, 576, generator=gen) * 2.0).to(torch.bfloat16)
        safe = torch.where(slots >= slots_n, -1, slots)
        want_o, want_lse = reference(q.float(), pages, safe, "fp8_ds_mla", None, 0.07)
        o, lse = sparse_mla_gluon(q.cuda(), pages_gpu, slots.cuda(), "fp8_ds_mla", None, 0.07, block_n=block_n,
                                  stages=stages, split_size=split, lazy=lazy, q_smem=q_smem,
                                  warps_per_tile=wpt)
        torch.cuda.synchronize()
        o, lse = o.float().cpu(), lse.cpu()
        o_err = float((o[:-1].double() - want_o[:-1].double()).norm() / want_o[:-1].double().norm())
        finite = torch.isfinite(want_lse)
        lse_err = float((lse[finite] - want_lse[finite]).abs().max())
        empty = bool(torch.isneginf(lse[-1]).all()) and bool((o[-1] == 0).all())
        ok = o_err < TOL_O and lse_err < TOL_LSE and empty and bool(torch.isfinite(lse[:-1]).all())
        case = f"H={heads} blocks of {block_tokens} width {width} split {split} block_n {block_n} stages {stages}" + \
            (" strided" if strided else "") + ("" if lazy else " eager rescale") + \
            (" q in smem" if q_smem else "") + f" {4 * wpt} warps"
        print(f"  {case:<72s} o rel err {o_err:.2e}  lse err {lse_err:.2e}  empty row ok {empty}  "
              f"{'pass' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(case)
    return finish("gluon_check", failures, started, "case(s) differ from the reference")


if __name__ == "__main__":
    run("gluon_check", main)
