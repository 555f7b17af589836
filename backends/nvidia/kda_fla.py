"""KDA prefill through flash-linear-attention's chunked kernel (``fla.ops.kda.chunk_kda``, fla-core 0.6).

What this route adds around fla's kernels, per call (nothing else is copied or converted):

* one launch gathering the batch's pool rows into the dense ``[N, H, K, V]`` fp32 ``initial_state``
  fla requires, and one scattering its ``final_state`` back (:mod:`.kda_state_rows`). fla 0.6's chunk
  path has no state-index argument (only ``fused_recurrent_kda`` takes ``ssm_state_indices``) and
  addresses ``h0``/``ht`` as dense ``n·H·K·V`` offsets, so a strided pool view cannot be passed in
  place. Both kernels read ids on the device: padding ids (-1) start from zero and write nothing, and
  no boolean mask forces a host sync. Each moves ``N·H·K·V·4`` bytes (16.8 MB at 8 x 4096).
* one host sync, copying ``cu_seqlens`` to the host for fla's ``cu_seqlens_cpu`` (fla builds its chunk
  list on the host regardless; from device lengths it would sync inside ``repeat_interleave``).
* q, k, v go in as they are (fla's ``input_guard`` copies only tensors that are not contiguous: a
  caller's fused-projection view is copied there, by fla); g in its own dtype (fla's cumsum kernel
  loads bf16/fp16/fp32 and writes the fp32 cumulative gate its other kernels read; an fp64 gate is
  declined by ``limits.kda_prefill``); beta converted to k's dtype only when it differs (``[T, H]``,
  fla multiplies it into k and v before its dots, which take one dtype).
* the l2norm of q and k is fla's (``use_qk_l2norm_in_kernel``), not a pass of ours (in fla 0.6 it is still
  its own kernel writing normalised q and k, which the plain fla call pays the same).
* the output is fla's output tensor, viewed ``[T, H, V]`` (no zero-fill, no copy). Empty sequences
  stay in: fla gives them no chunk and returns their initial state as final, written back unchanged.

The design of an own chunked kernel that would beat fla by 1.5x at 8 x 4096 is in
``docs/kda-prefill.md`` (FLOP and byte counts of the shape, where fla's time goes, what it needs).
"""
from __future__ import annotations

import functools
import importlib.util
import inspect

import torch

from dsahal.backends.triton_kernels import limits

from . import config
from .fla_setup import import_chunk_kda
from .fla_setup import status as fla_status
from .kda_state_rows import gather_states, scatter_states


def probe() -> tuple[bool, str]:
    """Installed or not, without importing it: ``import fla.ops.kda`` takes 8.1 s on the H200 (fla's package
    imports every op family; 2026-12-01, ``scripts/h200/startup_profile.py``), which every process that
    built a table paid before its first kernel. The import happens at the first call this route is asked
    to serve (:func:`loaded`), and a failure then declines the route for the process."""
    if importlib.util.find_spec("fla") is None:
        return False, "fla-core is not installed (pip install fla-core)"
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("fla-core")
    except PackageNotFoundError:
        installed = "(version unknown)"
    return True, f"fla-core {installed} chunk_kda (imported at its first call); {fla_status()}"


_loaded: tuple[bool, str] | None = None


def loaded() -> tuple[bool, str]:
    """``(True, "")`` once ``fla.ops.kda`` imported (done on the first ask), else ``(False, why)`` for good."""
    global _loaded
    if _loaded is None:
        try:
            import_chunk_kda()
            _loaded = (True, "")
        except Exception as exc:  # noqa: BLE001 - any import failure means "not usable in this process"
            _loaded = (False, f"fla.ops.kda does not import: {type(exc).__name__}: {exc}")
    return _loaded


def accepts(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm) -> tuple[bool, str]:
    """fla's chunk kernel serves bf16/fp16 inputs outside batch-invariant mode: it picks its tiles by the
    batch's total length, and runs its dots at tf32/bf16 precision (2.3e-3 relative error on fp32 inputs,
    where the conformance suite allows fp32's 9.8e-4; H200, 2026-11-29), so fp32 inputs stay on the
    exact recurrent kernel."""
    if config.batch_invariant():
        return False, "batch-invariant mode: fla's chunk tiles depend on the batch's total length"
    if q.dtype == torch.float32:
        return False, "fp32 inputs: fla's chunk kernel computes at tf32/bf16 precision"
    if not q.dtype == k.dtype == v.dtype:
        # fla's dots take one operand dtype; converting here would copy [T, H, K] tensors per call.
        return False, (f"mixed q/k/v dtypes ({_name(q.dtype)}/{_name(k.dtype)}/{_name(v.dtype)}): fla's chunk "
                       "kernel needs one dtype")
    ok = limits.kda_prefill(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm)
    return loaded() if ok[0] else ok


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def kda_prefill_fla(q, k, v, g, beta, cu_seqlens, state_pool, state_ids, scale, use_qk_l2norm):
    """q, k, g ``[T, H, K]``; v ``[T, H, V]``; beta ``[T, H]``; cu_seqlens ``[B + 1]``;
    state_pool ``[P, H, K, V]`` fp32 (updated in place at ``state_ids``); state_ids ``[B]``.
    Returns ``[T, H, V]`` in q's dtype: fla's own output tensor (a view, no copy)."""
    chunk_kda = import_chunk_kda()
    if q.shape[0] == 0 or state_ids.shape[0] == 0:
        return torch.zeros(v.shape, dtype=q.dtype, device=q.device)
    # The one host synchronisation: fla builds its chunk list on the host either way (from the device
    # lengths its prepare_chunk_indices syncs); given the host copy it builds it there and uploads it.
    bounds_cpu = cu_seqlens.to("cpu", torch.int64) if _takes_host_bounds(chunk_kda) else None
    # fla memoises its chunk indices/offsets by the *identity* of cu_seqlens (fla.utils.tensor_cache):
    # the caller's tensor, reused with new contents (a persistent buffer), would get stale chunks. A
    # fresh view per call is a new object (a miss) and costs no copy.
    bounds = cu_seqlens.to(torch.int64).view(-1)
    initial = gather_states(state_pool, state_ids)  # dense [B, H, K, V] fp32, zeros for padding ids
    host = {"cu_seqlens_cpu": bounds_cpu} if _takes_host_bounds(chunk_kda) else {}
    o, final = chunk_kda(
        q[None], k[None], v[None], limits.kda_gate(g)[None], beta.to(k.dtype)[None],
        scale=scale, initial_state=initial, output_final_state=True,
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm), cu_seqlens=bounds, **host,
    )
    scatter_states(final, state_ids, state_pool)  # padding ids write nothing
    return o[0]


@functools.lru_cache(maxsize=4)
def _takes_host_bounds(chunk_kda) -> bool:
    """fla 0.6 names ``cu_seqlens_cpu``; an older fla-core (the extra allows >= 0.4) gets device bounds only
    and builds its chunk list from them (one sync inside fla instead of ours)."""
    return "cu_seqlens_cpu" in inspect.signature(chunk_kda).parameters
