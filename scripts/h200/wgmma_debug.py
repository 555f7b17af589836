"""Temporary: isolate the wgmma few-heads kernel's value path with crafted records (deleted once it passes)."""
import torch
from dsahal.backends.triton_kernels.sparse_mla_wgmma import sparse_mla_wgmma
from dsahal.formats import latent_format
from dsahal.reference.sparse_mla import sparse_mla as reference

spec = latent_format("fp8_ds_mla")
gen = torch.Generator().manual_seed(0)
torch.set_printoptions(precision=4, linewidth=200)


def run(name, rows, q, slots, split=None):
    records = spec.pack(rows).view(-1, 64, 656)
    want_o, want_lse = reference(q.float(), records, slots, "fp8_ds_mla", None, 0.07)
    o, lse = sparse_mla_wgmma(q.cuda(), records.cuda(), slots.cuda(), "fp8_ds_mla", None, 0.07, split_size=split)
    o = o.float().cpu()
    err = float((o.double() - want_o.double()).norm() / want_o.double().norm())
    lerr = float((lse.cpu() - want_lse).abs().max())
    print(f"{name}: o rel err {err:.3e} lse err {lerr:.2e}")
    d = (o - want_o).abs()
    print("  worst (token, head, dim):", [tuple(int(x) for x in torch.nonzero(d == d.max())[0])],
          "err per head:", [f"{float(d[:, h].max()):.2e}" for h in range(o.shape[1])][:16])
    print("  err per dim-block of 4 (head 0, token 0):", [f"{float(d[0, 0, i:i + 4].max()):.1e}" for i in range(0, 64, 4)])
    print("  o[0,0,:8]", o[0, 0, :8], "\n  w[0,0,:8]", want_o[0, 0, :8].float())
    return o, want_o


n = 128
slots = torch.arange(64, dtype=torch.int32)[None].repeat(2, 1)
dimpat = (torch.arange(576) % 37 + 1.0) / 37.0
run("D1 same record in every slot, random q", dimpat[None].repeat(n, 1), torch.randn(2, 16, 576).bfloat16(), slots)
per_slot = (torch.arange(n) % 13 + 1.0)[:, None].repeat(1, 576)
run("D2 constant per slot, q = 0", per_slot, torch.zeros(2, 16, 576).bfloat16(), slots)
run("D3 constant per slot, random q", per_slot, torch.randn(2, 16, 576).bfloat16(), slots)
rows = torch.randn(n, 576, generator=gen)
run("D4 random, H=1", rows, torch.randn(2, 1, 576).bfloat16(), slots)
run("D5 random, H=2", rows, torch.randn(2, 2, 576).bfloat16(), slots)
run("D6 random, H=16", rows, torch.randn(2, 16, 576).bfloat16(), slots)
s16 = torch.arange(16, dtype=torch.int32)[None].repeat(2, 1)
run("D7 random, H=16, 16 slots", rows, torch.randn(2, 16, 576).bfloat16(), s16)
s1 = torch.tensor([[5], [9]], dtype=torch.int32)
run("D8 random, H=16, 1 slot", rows, torch.randn(2, 16, 576).bfloat16(), s1)
