"""Move KDA states between the pool and the dense ``[N, H, K, V]`` tensors fla's chunk kernels take.

fla's ``chunk_kda`` (0.6) reads ``initial_state`` and writes ``final_state`` as dense ``[N, H, K, V]``
tensors, one state per sequence in order (its kernels address ``h0 + (n * H + h) * K * V``; no
state-index argument exists in its chunk path, only in ``fused_recurrent_kda``). The pool is
``[P, H, K, V]`` fp32, possibly a strided view of the packed cache (a layer's states are strided row
runs), addressed per sequence by ``state_ids``; id -1 is a padding request (start from zero, write
nothing). One launch each way, reading/writing the pool rows in place through their strides, with no
host synchronisation (a boolean mask of live ids would need one): ids are read on the device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsahal.kernel_launch import wrap_launched


@triton.jit
def _rows(pool_ptr, stride_pp, stride_ph, stride_pk, ids_ptr, H, K, V, P, BLOCK_K: tl.constexpr,
          BLOCK_V: tl.constexpr):
    """Program (n·H + h, k block): the dense offsets of ``[n, h, kb]``, the pool pointers of
    ``pool[ids[n], h, kb]``, the in-bounds mask and whether ``ids[n]`` is a pool row (lanes over V)."""
    n = tl.program_id(0) // H
    h = (tl.program_id(0) % H).to(tl.int64)  # h · stride_ph may pass 2^31 in a packed cache
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    vs = tl.arange(0, BLOCK_V)
    sid = tl.load(ids_ptr + n + 0 * vs).to(tl.int64)
    live = (sid >= 0) & (sid < P)
    inside = (ks[:, None] < K) & (vs[None, :] < V)
    pool = pool_ptr + tl.where(live, sid, 0)[None, :] * stride_pp + h * stride_ph + ks[:, None] * stride_pk \
        + vs[None, :]
    dense = ((n * H + h) * K + ks[:, None]) * V + vs[None, :]
    return dense, pool, inside, live[None, :]


@triton.jit
def _gather_kernel(pool_ptr, stride_pp, stride_ph, stride_pk, ids_ptr, out_ptr, H, K, V, P,
                   BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """out[n, h, kb] = pool[ids[n], h, kb] (zeros when ids[n] is not a row)."""
    dense, pool, inside, live = _rows(pool_ptr, stride_pp, stride_ph, stride_pk, ids_ptr, H, K, V, P, BLOCK_K,
                                      BLOCK_V)
    tl.store(out_ptr + dense, tl.load(pool, mask=inside & live, other=0.0), mask=inside)


@triton.jit
def _scatter_kernel(src_ptr, ids_ptr, pool_ptr, stride_pp, stride_ph, stride_pk, H, K, V, P,
                    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    """pool[ids[n], h, kb] = src[n, h, kb] where ids[n] is a row."""
    dense, pool, inside, live = _rows(pool_ptr, stride_pp, stride_ph, stride_pk, ids_ptr, H, K, V, P, BLOCK_K,
                                      BLOCK_V)
    tl.store(pool, tl.load(src_ptr + dense, mask=inside, other=0.0), mask=inside & live)


def _grid_and_blocks(count: int, heads: int, key_dim: int, value_dim: int):
    block_v = triton.next_power_of_2(value_dim)
    block_k = max(1, min(triton.next_power_of_2(key_dim), 2048 // block_v))  # ~2K fp32 per program
    return (count * heads, triton.cdiv(key_dim, block_k)), block_k, block_v


def _check_pool(op: str, state_pool: torch.Tensor) -> None:
    if state_pool.dim() != 4 or state_pool.dtype != torch.float32 or state_pool.stride(-1) != 1:
        raise ValueError(f"{op}: argument 'state_pool' expected [P, H, K, V] fp32 with unit stride in V, got "
                         f"shape {list(state_pool.shape)}, {state_pool.dtype}, strides {list(state_pool.stride())}")


def gather_states(state_pool: torch.Tensor, state_ids: torch.Tensor) -> torch.Tensor:
    """state_pool ``[P, H, K, V]`` fp32 (unit stride in V; other strides free); state_ids ``[N]`` int.
    Returns a new dense ``[N, H, K, V]`` fp32: the addressed rows, zeros where an id is -1."""
    _check_pool("kda gather_states", state_pool)
    _, heads, key_dim, value_dim = state_pool.shape
    count = state_ids.shape[0]
    out = torch.empty((count, heads, key_dim, value_dim), dtype=torch.float32, device=state_pool.device)
    if out.numel() == 0:
        return out
    grid, block_k, block_v = _grid_and_blocks(count, heads, key_dim, value_dim)
    _gather_kernel[grid](state_pool, state_pool.stride(0), state_pool.stride(1), state_pool.stride(2), state_ids,
                         out, heads, key_dim, value_dim, state_pool.shape[0], BLOCK_K=block_k, BLOCK_V=block_v)
    return out


def scatter_states(states: torch.Tensor, state_ids: torch.Tensor, state_pool: torch.Tensor) -> None:
    """states ``[N, H, K, V]`` fp32 dense; writes ``state_pool[state_ids[n]] = states[n]`` in place for every
    id that is a row (-1: nothing). Other pool rows are not touched. Ids must be distinct (the op checks)."""
    _check_pool("kda scatter_states", state_pool)
    _, heads, key_dim, value_dim = state_pool.shape
    count = state_ids.shape[0]
    if tuple(states.shape) != (count, heads, key_dim, value_dim) or states.dtype != torch.float32 \
            or not states.is_contiguous():
        raise ValueError(f"kda scatter_states: argument 'states' expected dense [{count}, {heads}, {key_dim}, "
                         f"{value_dim}] fp32, got shape {list(states.shape)}, {states.dtype}, "
                         f"strides {list(states.stride())}")
    if states.numel() == 0:
        return
    grid, block_k, block_v = _grid_and_blocks(count, heads, key_dim, value_dim)
    _scatter_kernel[grid](states, state_ids, state_pool, state_pool.stride(0), state_pool.stride(1),
                          state_pool.stride(2), heads, key_dim, value_dim, state_pool.shape[0], BLOCK_K=block_k,
                          BLOCK_V=block_v)


# Last: the two kernels above launch through the launch cache (dsahal.kernel_launch).
wrap_launched(globals())
