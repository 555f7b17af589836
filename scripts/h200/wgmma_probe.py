"""The wgmma few-heads sparse MLA kernel on one H200: its precision at large logits, and its GPU time beside FlashMLA's
by query tokens (the default route's token threshold, ``config.WGMMA_MIN_TOKENS``).

Usage (on a CUDA machine, from the repository root)::

    python3 scripts/h200/wgmma_probe.py

1. Per row of 6 tokens x 16 heads x 1,000 slots (records 2^-6..2^6, some 4x larger late, leading slots skipped):
   o's relative error and lse's absolute error against the float64 reference, the row's largest logit and the
   smallest gap between a head's two largest logits (an FP8-accumulated logit is off by about 2^-13 of sum |q k|:
   near-tied maxima at logits in the thousands then get the wrong softmax weights).
2. n x 1 query tokens (n = 8 .. 128) x 2048 slots over a 1M-token pool: GPU time from CUDA-graph replay of FlashMLA's
   decode (heads padded to 64) and of ours at 1024 / 512 / 256-slot splits, then both by ``do_bench``.

Results: BENCHMARKS.md, twenty-second session (R4).
"""
from __future__ import annotations

import timing  # scripts/h200/timing.py (this folder is on sys.path when the script runs)
import pools as cache_pools  # scripts/h200/pools.py
import wgmma_mla_check as c  # scripts/h200/wgmma_mla_check.py
from gluon_launch import graph_us  # scripts/h200/gluon_launch.py
from script_cli import run, start  # scripts/h200/script_cli.py


def precision(torch):
    """Step 1: per-row errors, largest logits and top-2 gaps."""
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
    from dsahal.formats import latent_format
    from dsahal.reference.sparse_mla import sparse_mla as reference

    gen = torch.Generator().manual_seed(7)
    spec = latent_format("fp8_ds_mla")
    for q_mag, grow, lead in ((8.0, 4.0, 600), (2.0, 4.0, 600), (8.0, 1.0, 600), (8.0, 4.0, 0), (8.0, 1.0, 0)):
        blocks, bt, width = 40, 64, 1000
        n = blocks * bt
        rows = torch.randn(n, 576, generator=gen) * torch.exp2(torch.randint(-6, 7, (n, 1), generator=gen))
        records = spec.pack(rows + 1e-3).view(blocks, bt, 656)
        slots = torch.randint(-1, n, (6, width), generator=gen, dtype=torch.int32)
        slots[:, :lead] = -1
        if grow != 1.0:
            g = spec.unpack(records.view(-1, 656)).float()
            g[slots[:, lead + 100:].clamp(min=0).long().unique()] *= grow
            records = spec.pack(g).view(blocks, bt, 656)
        q = (torch.randn(6, 16, 576, generator=gen) * q_mag).to(torch.bfloat16)
        want_o, want_lse = reference(q.float(), records, slots, "fp8_ds_mla", None, 0.07)
        kv = spec.unpack(records.view(-1, 656)).double()[slots.clamp(min=0).long()]
        logits = torch.einsum("thd,tkd->thk", q.double(), kv) * 0.07
        logits = torch.where((slots >= 0)[:, None, :], logits, float("-inf"))
        top2 = logits.topk(2, dim=-1).values
        o, lse = sparse_mla_wgmma(q.cuda(), records.cuda(), slots.cuda(), "fp8_ds_mla", None, 0.07, stages=2,
                                  split_size=None)
        o, lse = o.float().cpu(), lse.cpu()
        print(f"|q|~{q_mag} grow {grow} lead {lead}")
        for t in range(6):
            oe = float((o[t].double() - want_o[t]).norm() / want_o[t].norm().clamp(min=1e-30))
            le = float((lse[t].double() - want_lse[t]).abs().max())
            print(f"  row {t}: o rel err {oe:.2e}  lse abs err {le:.2e}  max logit {float(top2[t, :, 0].max()):.1f}  "
                  f"smallest top-2 gap {float((top2[t, :, 0] - top2[t, :, 1]).min()):.3f}", flush=True)


def threshold(torch):
    """Step 2: GPU time by query tokens, ours and FlashMLA's."""
    from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma

    pages = cache_pools.latent_pools(torch, ("fp8_ds_mla",), 1 << 20, "cuda")["fp8_ds_mla"][0]
    print("| tokens | FlashMLA (pad 64) graph us | ours split 1024 | 512 | 256 | do_bench ms FlashMLA | ours 1024 |")
    for requests in (8, 16, 32, 64, 128):
        g = torch.Generator(device="cuda").manual_seed(requests)
        slots = torch.randint(0, pages.shape[0] * 64, (requests, 2048), device="cuda", dtype=torch.int32, generator=g)
        q = torch.randn(requests, 16, 576, device="cuda", generator=g).to(torch.bfloat16)
        peer = c.flash_mla(torch, q, pages, slots, requests, 1)
        if peer is None:  # (flash_mla said why): the table needs its column
            return
        row = [graph_us(torch, peer[0])]
        ours = {split: (lambda split=split: sparse_mla_wgmma(q, pages, slots, "fp8_ds_mla", None, c.SOFTMAX_SCALE,
                                                              split_size=split))
                for split in (1024, 512, 256)}
        row += [graph_us(torch, ours[split]) for split in (1024, 512, 256)]
        row += [1e3 * timing.bench_ms(peer[0], "cuda"), 1e3 * timing.bench_ms(ours[1024], "cuda")]
        print(f"| {requests} | " + " | ".join(f"{x:.1f}" for x in row) + " |", flush=True)


def main() -> int:
    torch, _, _, _ = start("wgmma_probe", "cuda")
    precision(torch)
    threshold(torch)
    return 0


if __name__ == "__main__":
    run("wgmma_probe", main)
