"""What ``dsahal run`` will allocate, estimated before it allocates anything, against what the machine has.

The weights and the cache are exact (parameter counts of the model built on the meta device, the
planner's rows); activations and the CPU-side transients are bounded from the shapes:

- weights: every parameter in the model dtype, on the run's device;
- initialisation (seeded weights are drawn on the CPU in fp32, one tensor at a time, scaled in place):
  the largest parameter once in fp32, plus once in the model dtype when that is not fp32, in CPU memory
  (a checkpoint is read whole first: its file size, plus that cast);
- cache: ``rows x row_bytes`` of the packed pool;
- activations of one prefill chunk of ``T`` tokens: hidden states, MLP, projections (the reference
  works in float64, so those twice over), one fp32 indexer row per token over the whole context, the
  chunked KDA reference's float64 ``[H, C, C, K]`` products, the KDA short convolution's fp32 taps
  and sums over q, k and v, the logits rows;
- ``--check``: every compared position's fp32 logits, kept on the CPU for the run and for the replay;
- the runtime itself (torch, Python): :data:`CPU_RUNTIME_BYTES`; a CUDA context: :data:`CUDA_RUNTIME_BYTES`.

Activations are multiplied by :data:`ACTIVATION_MARGIN`. The estimate is compared with what is free:
``MemAvailable`` of ``/proc/meminfo`` (``os.sysconf`` elsewhere), lowered to the cgroup's limit where a
container has one, and ``torch.cuda.mem_get_info`` for a CUDA device.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

GIB = 1 << 30
CPU_RUNTIME_BYTES = 512 << 20
CUDA_RUNTIME_BYTES = 512 << 20
ACTIVATION_MARGIN = 1.5
KDA_CHUNK = 64


class MemoryEstimateError(ValueError):
    """The run would not fit in the memory this machine has free; nothing was allocated."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes the run needs: ``host`` (CPU RAM) and ``device`` (the CUDA device; 0 for a CPU run)."""

    weights: int
    init_transient: int
    cache: int
    activations: int
    check_logits: int
    host: int
    device: int
    device_type: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def parameter_bytes(config, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of every parameter in ``dtype``, elements of the largest parameter), from a meta-device model."""
    from ..model import HybridModel
    from ..model.meta import on_meta

    with on_meta():
        model = HybridModel(config)
    sizes = [p.numel() for p in model.parameters()]
    element = torch.empty((), dtype=dtype).element_size()
    return sum(sizes) * element, max(sizes)


def estimate_run_memory(config, *, dtype: torch.dtype, device: torch.device, cache_bytes: int, tokens_per_step: int,
                        max_context: int, sampled_rows: int, check_positions: int = 0,
                        checkpoint_bytes: int = 0) -> MemoryEstimate:
    """The estimate of the module docstring.

    Args:
        config: the :class:`~dsahal.config.ModelConfig`.
        dtype, device: the model's.
        cache_bytes: the packed pool's bytes (rows x row_bytes).
        tokens_per_step: the most tokens one step packs (the prefill chunk, or the whole prompt if shorter).
        max_context: the longest request's tokens (the indexer scores every one per query token).
        sampled_rows: logits rows per step (one per request, more with drafts).
        check_positions: positions whose logits ``--check`` keeps (0 without ``--check``).
        checkpoint_bytes: the size of the checkpoint loaded instead of drawing weights (0: seeded weights).
    """
    element = torch.empty((), dtype=dtype).element_size()
    weights, largest = parameter_bytes(config, dtype)
    init = checkpoint_bytes + largest * (4 + (element if element != 4 else 0))  # fp32 draw (or file), its cast
    heads, kda_heads = config.num_heads, config.kda_num_heads
    per_token = (8 * config.hidden_size + 3 * config.intermediate_size) * element
    projections = (config.q_lora_rank + heads * (config.qk_nope_dim + config.qk_rope_dim + config.latent_dim)
                   + config.index_heads * config.index_dim + config.latent_dim + 6 * kda_heads * config.kda_head_dim)
    per_token += projections * (element + 8)  # the model dtype, and the reference's float64 copies
    per_token += 4 * 3 * kda_heads * config.kda_head_dim * 4  # short conv: fp32 input table, tap, sum, silu
    kda_chunk = 4 * kda_heads * KDA_CHUNK * KDA_CHUNK * config.kda_head_dim * 8
    activations = int(ACTIVATION_MARGIN * (tokens_per_step * (per_token + 4 * max_context)
                                           + kda_chunk + 2 * sampled_rows * config.vocab_size * 4))
    check_logits = 2 * check_positions * config.vocab_size * 4  # the run's and the replay's, fp32, on the CPU
    if device.type == "cuda":
        host = CPU_RUNTIME_BYTES + init + check_logits + 2 * sampled_rows * config.vocab_size * 4
        on_device = CUDA_RUNTIME_BYTES + weights + cache_bytes + activations
    else:
        host = CPU_RUNTIME_BYTES + weights + init + cache_bytes + activations + check_logits
        on_device = 0
    return MemoryEstimate(weights=weights, init_transient=init, cache=cache_bytes, activations=activations,
                          check_logits=check_logits, host=host, device=on_device, device_type=device.type)


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_available() -> Optional[int]:
    """What the cgroup (v2, else v1) still allows this container, or None where it sets no limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as limit, open(usage_file) as usage:
                text = limit.read().strip()
                if text == "max" or int(text) >= 1 << 60:
                    return None
                return max(0, int(text) - int(usage.read().strip()))
        except (OSError, ValueError):
            continue
    return None


def host_available_bytes() -> Optional[int]:
    """Free CPU memory: MemAvailable (or sysconf's available pages), at most what the cgroup allows."""
    available = _meminfo_available()
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = None
    cgroup = _cgroup_available()
    if cgroup is not None:
        available = cgroup if available is None else min(available, cgroup)
    return available


def device_available_bytes(device: torch.device) -> Optional[int]:
    """Free memory of a CUDA device (``torch.cuda.mem_get_info``); None for other devices."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def check_fits(estimate: MemoryEstimate, device: torch.device, *, processes: int = 1,
               what: str = "dsahal run") -> dict:
    """Raise :class:`MemoryEstimateError` when the estimate exceeds what is free; returns what was free.

    ``processes``: processes of this run sharing the host (DCP ranks started on one machine)."""
    host_free = host_available_bytes()
    device_free = device_available_bytes(device)
    host_need = estimate.host * processes
    shared = f" ({processes} processes x {estimate.host / GIB:.1f} GiB)" if processes > 1 else ""
    if host_free is not None and host_need > host_free:
        raise MemoryEstimateError(
            f"{what}: needs about {host_need / GIB:.1f} GiB of CPU memory{shared} (weights "
            f"{estimate.weights / GIB:.1f} GiB, cache {estimate.cache / GIB:.1f} GiB, activations "
            f"{estimate.activations / GIB:.1f} GiB, initialisation {estimate.init_transient / GIB:.1f} GiB"
            + (f", --check logits {estimate.check_logits / GIB:.1f} GiB" if estimate.check_logits else "")
            + f"), this machine has {host_free / GIB:.1f} GiB available; use a smaller --config, --batch, "
            f"--prompt-len or --chunk, or --no-memory-check to try anyway")
    if device_free is not None and estimate.device > device_free:
        raise MemoryEstimateError(
            f"{what}: needs about {estimate.device / GIB:.1f} GiB on {device} (weights "
            f"{estimate.weights / GIB:.1f} GiB, cache {estimate.cache / GIB:.1f} GiB, activations "
            f"{estimate.activations / GIB:.1f} GiB), the device has {device_free / GIB:.1f} GiB free; use a "
            f"smaller --config, --batch, --prompt-len or --chunk, or --no-memory-check to try anyway")
    return {"host_available_bytes": host_free, "device_available_bytes": device_free}
