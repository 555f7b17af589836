"""Measure fla's chunk_kda configs on this GPU and write them in fla's config-file format.

Runs chunk_kda (bf16, 32 heads, K = V = 128) at the shapes dsahal serves, with fla's own autotuning on
(FLA_CACHE_MODE unset), every autotuned kernel behind fla's CachedAutotuner; then writes one JSON per
kernel into one bundle (``$OUT/fla_configs.json``: {kernel: file content}) for
``backends/nvidia/fla_configs/<GPU>/``. The default config of each kernel is the one chosen at its
largest key. Then times chunk_kda at 8 x 4096 for the record.
"""
import gc
import json
import os
import sys
import time

import torch
import triton

from fla.ops.utils import cache

os.environ.pop("FLA_CACHE_MODE", None)
triton.autotune = cache.fla_cache_autotune
from fla.ops.kda import chunk_kda  # noqa: E402

H, K, V = 32, 128, 128


def run(lengths, dtype=torch.bfloat16):
    total = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(len(lengths))
    q, k = (torch.randn(1, total, H, K, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    v = torch.randn(1, total, H, V, device="cuda", dtype=dtype, generator=g)
    gate = -torch.rand(1, total, H, K, device="cuda", generator=g) * 0.1
    beta = torch.rand(1, total, H, device="cuda", dtype=dtype, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.long)
    h0 = torch.randn(len(lengths), H, K, V, device="cuda", generator=g) * 0.1
    fn = lambda: chunk_kda(q, k, v, gate, beta, scale=K ** -0.5, initial_state=h0, output_final_state=True,  # noqa
                           use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    fn()
    torch.cuda.synchronize()
    return fn


start = time.time()
shapes = [[4096] * 8, [3000, 17, 1024, 64, 5000, 1], [1] * 64, [5] * 64, [512] * 64, [64] * 16, [2048, 2048]]
for lengths in shapes:
    run(lengths)
print(f"autotuned {len(shapes)} shape sets in {time.time() - start:.1f} s")
bundle = {}
for obj in gc.get_objects():
    if isinstance(obj, cache.CachedAutotuner) and obj.cache:
        entries = {}
        largest = None
        for key, cfg in obj.cache.items():
            record = {"kwargs": dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                      "num_ctas": getattr(cfg, "num_ctas", 1), "maxnreg": getattr(cfg, "maxnreg", None)}
            akey = cache.AutotuneKey.normalize_autotune_key(list(key))
            entries[cache.AutotuneKey.key_hash(tuple(key))] = {"autotune_key": akey, "config": record}
            size = sum(x for x in key if isinstance(x, int) and not isinstance(x, bool))
            if largest is None or size > largest[0]:
                largest = (size, record)
        bundle[obj.kernel_name] = {"kernel_name": obj.kernel_name, "triton_version": triton.__version__,
                                   "gpu": torch.cuda.get_device_name(0), "autotune_entries": entries,
                                   "default_config": largest[1]}
out = os.environ.get("OUT", ".")
with open(os.path.join(out, "fla_configs.json"), "w") as f:
    json.dump(bundle, f, indent=1, sort_keys=True)
print(f"{len(bundle)} kernels: {sorted(bundle)}")
fn = run([4096] * 8)
print("chunk_kda 8x4096 (autotuned) ms:", triton.testing.do_bench(fn, rep=200))
sys.exit(0)
