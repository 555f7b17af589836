"""The packed KV cache: one uint8 row pool, per-layer page and state views into it, and its allocator."""
from __future__ import annotations

import torch

from ..formats import latent_format
from ..ops._validate import can_read_values
from ..formats.base import scale_limit_text
from .allocator import CacheFullError, RowAllocator, as_int
from .layout import FP32_BYTES, MAX_SLOTS, CacheLayout


class PackedKVCache:
    """A pool ``[num_rows, row_bytes]`` uint8 holding DSA pages (one block per row) and KDA states.

    Views (no copies; a write through a view lands in :attr:`pool`):

    - :meth:`latent_pages` / :meth:`index_pages`: ``[num_blocks, block_tokens, token_bytes]`` uint8,
      block ``b`` = row ``b``; slot ``s`` of a layer is ``(s // block_tokens, s % block_tokens)``.
    - :meth:`kda_states`: ``[num_state_slots, H_local, K, V]`` fp32; state id ``i`` = rows
      ``[i * rows_per_state, (i + 1) * rows_per_state)``.
    - :meth:`kda_conv_states`: ``[num_state_slots, 3, kernel - 1, H_local * K]`` fp32, the same state ids:
      the last ``kernel - 1`` inputs of the layer's q, k and v short convolutions.
    - :meth:`block_bytes`: one block's whole row, contiguous (a block transfer is one copy).

    Rows are handed out by :meth:`allocate_blocks` / :meth:`allocate_state`; page views cover every
    row, so only block ids the allocator gave out may be written through them.
    """

    def __init__(self, layout: CacheLayout, num_rows: int, device: str | torch.device = "cpu"):
        if not isinstance(layout, CacheLayout):
            raise TypeError(f"dsahal.cache.PackedKVCache: argument 'layout' expected a CacheLayout, "
                            f"got {type(layout).__name__}")
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
            raise ValueError(f"dsahal.cache.PackedKVCache: argument 'num_rows' expected an int >= 1, got {num_rows!r}")
        # Slots (block * block_tokens + offset) are int32 in every op and kernel: a pool with more slots could
        # not be addressed (cache_write and sparse_mla refuse its page views). Checked before allocating.
        if num_rows * layout.block_tokens > MAX_SLOTS:
            raise ValueError(f"dsahal.cache.PackedKVCache: argument 'num_rows' expected at most "
                             f"{MAX_SLOTS // layout.block_tokens} (num_rows * block_tokens={layout.block_tokens} slots "
                             f"must fit an int32 slot id), got {num_rows}")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"dsahal.cache.PackedKVCache: argument 'device' expected a torch device, got {device!r}: "
                             f"{exc}") from None
        self.layout = layout
        try:
            self.pool = torch.zeros((num_rows, layout.row_bytes), dtype=torch.uint8, device=device)
        except (RuntimeError, MemoryError) as exc:  # out of memory (torch.OutOfMemoryError is a RuntimeError)
            raise type(exc)(f"dsahal.cache.PackedKVCache: argument 'num_rows' expected a pool that fits on device "
                            f"{device!s}, got {num_rows} rows x {layout.row_bytes} B = {num_rows * layout.row_bytes} "
                            f"bytes: {exc}") from exc
        self._pool_fp32 = self.pool.view(-1).view(torch.float32)  # row_bytes is a multiple of 256
        self.allocator = RowAllocator(num_rows, layout.rows_per_state if layout.states else 0)
        self._latent_spec = latent_format(layout.latent_fmt)
        # One per-tensor scale per DSA layer for formats that need one (fp8); 1.0 until calibrated.
        self._latent_scales = (torch.ones(layout.num_dsa_layers, dtype=torch.float32, device=device)
                               if self._latent_spec.needs_tensor_scale else None)

    @classmethod
    def from_budget(cls, layout: CacheLayout, budget_bytes: int, device: str | torch.device = "cpu"):
        """As many rows as fit in ``budget_bytes``."""
        if not isinstance(layout, CacheLayout):
            raise TypeError(f"dsahal.cache.PackedKVCache.from_budget: argument 'layout' expected a CacheLayout, "
                            f"got {type(layout).__name__}")
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int):
            raise TypeError(f"dsahal.cache.PackedKVCache.from_budget: argument 'budget_bytes' expected an int, "
                            f"got {type(budget_bytes).__name__}")
        rows = budget_bytes // layout.row_bytes
        if rows < 1:
            raise ValueError(f"dsahal.cache.PackedKVCache.from_budget: argument 'budget_bytes' expected at least one "
                             f"row ({layout.row_bytes} bytes), got {budget_bytes}")
        if rows * layout.block_tokens > MAX_SLOTS:
            max_bytes = (MAX_SLOTS // layout.block_tokens + 1) * layout.row_bytes - 1
            raise ValueError(f"dsahal.cache.PackedKVCache.from_budget: argument 'budget_bytes' expected at most "
                             f"{max_bytes} ({MAX_SLOTS // layout.block_tokens} rows: slots must fit an int32 slot id), "
                             f"got {budget_bytes}")
        return cls(layout, rows, device)

    # -- sizes -------------------------------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self.pool.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.num_rows

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    @property
    def row_bytes(self) -> int:
        return self.layout.row_bytes

    @property
    def num_state_slots(self) -> int:
        return self.allocator.num_state_slots

    # -- views -------------------------------------------------------------------------------------
    def _pages(self, layer: int, kind: str) -> torch.Tensor:
        spec = self.layout.page(layer, kind)
        return self.pool.as_strided(
            (self.num_rows, self.block_tokens, spec.token_bytes),
            (self.row_bytes, spec.token_bytes, 1),
            self.pool.storage_offset() + spec.offset,
        )

    def latent_pages(self, layer: int) -> torch.Tensor:
        """``[num_blocks, block_tokens, latent_token_bytes]`` uint8 view of DSA layer ``layer``'s latent pages."""
        return self._pages(layer, "latent")

    def index_pages(self, layer: int) -> torch.Tensor:
        """``[num_blocks, block_tokens, index_token_bytes]`` uint8 view of DSA layer ``layer``'s index-key pages."""
        return self._pages(layer, "index")

    def latent_scale(self, layer: int) -> torch.Tensor | None:
        """``[]`` fp32 view of layer ``layer``'s per-tensor latent scale (settable in place with
        ``fill_``/``copy_``) for formats with a tensor scale (``"fp8"``), else None."""
        self.layout.page(layer, "latent")  # validates the layer
        if self._latent_scales is None:
            return None
        return self._latent_scales[self.layout.dsa_layers.index(layer)]

    def set_latent_scale(self, layer: int, value: float) -> None:
        scale = self.latent_scale(layer)
        if scale is None:
            raise ValueError(f"dsahal.cache.set_latent_scale: latent format {self.layout.latent_fmt!r} has no "
                             f"per-tensor scale")
        try:  # a float, a NumPy float or a one-element tensor (an amax / 448 computed on the device)
            number = None if isinstance(value, (bool, str, bytes)) else float(value)
        except (TypeError, ValueError, RuntimeError):
            number = None
        if number is None:
            raise TypeError(f"dsahal.cache.set_latent_scale: argument 'value' expected a float, "
                            f"got {type(value).__name__} {value!r}")
        # Checked as the fp32 the cache stores: 1e-50 would become 0 and 1e39 Inf in the scale tensor.
        stored = float(torch.tensor(number, dtype=torch.float64).float())
        if not self._latent_spec.accepts_scale(stored):
            raise ValueError(f"dsahal.cache.set_latent_scale: argument 'value' expected a finite float > 0 that stays "
                             f"> 0 in fp32{scale_limit_text(self._latent_spec)}, got {value}")
        scale.fill_(stored)

    def kda_states(self, layer: int) -> torch.Tensor:
        """``[num_state_slots, H_local, K, V]`` fp32 view of KDA layer ``layer``'s states; row ``i`` is
        state id ``i``. Pass it as ``state_pool`` to ``dsahal.ops.kda_decode``/``kda_prefill``."""
        spec = self.layout.state(layer)
        heads, key_dim, value_dim = self.layout.kda_heads_local, self.layout.kda_key_dim, self.layout.kda_value_dim
        slot_stride = self.layout.state_slot_bytes // FP32_BYTES
        return self._pool_fp32.as_strided(
            (self.num_state_slots, heads, key_dim, value_dim),
            (slot_stride, key_dim * value_dim, value_dim, 1),
            self._pool_fp32.storage_offset() + spec.offset // FP32_BYTES,
        )

    def kda_conv_states(self, layer: int) -> torch.Tensor:
        """``[num_state_slots, 3, kernel - 1, H_local * K]`` fp32 view of KDA layer ``layer``'s short-convolution
        states (q, k, v; oldest input first); row ``i`` is state id ``i``, as in :meth:`kda_states`."""
        spec = self.layout.conv_state(layer)
        width, channels = self.layout.kda_conv_kernel - 1, self.layout.kda_conv_channels
        slot_stride = self.layout.state_slot_bytes // FP32_BYTES
        return self._pool_fp32.as_strided(
            (self.num_state_slots, 3, width, channels), (slot_stride, width * channels, channels, 1),
            self._pool_fp32.storage_offset() + spec.offset // FP32_BYTES,
        )

    def block_bytes(self, block_id: int) -> torch.Tensor:
        """``[row_bytes]`` uint8 contiguous view of block ``block_id``'s row (all its DSA pages)."""
        block_id = as_int("dsahal.cache.block_bytes", "block_id", block_id)
        if not 0 <= block_id < self.num_rows:
            raise ValueError(f"dsahal.cache.block_bytes: argument 'block_id' expected an int in [0, {self.num_rows}), "
                             f"got {block_id!r}")
        return self.pool[block_id]

    def slot_byte_offsets(self, layer: int, kind: str, slots: torch.Tensor) -> torch.Tensor:
        """Byte offset into :attr:`pool` of each token record at ``slots`` (int64, same shape; -1 stays -1):
        ``block * row_bytes + page offset + (slot % block_tokens) * token_bytes``.

        ``slots`` is an int32/int64 tensor with values in ``[-1, num_rows * block_tokens)``: an offset is an
        address someone copies to or from, so a slot past the pool (or a float truncated to one) must not
        become an address outside it."""
        where = "dsahal.cache.slot_byte_offsets"
        spec = self.layout.page(layer, kind)
        if not isinstance(slots, torch.Tensor) or slots.dtype not in (torch.int32, torch.int64):
            got = f"dtype {str(slots.dtype).replace('torch.', '')}" if isinstance(slots, torch.Tensor) else \
                type(slots).__name__
            raise TypeError(f"{where}: argument 'slots' expected an int32 or int64 tensor, got {got}")
        num_slots = self.num_rows * self.block_tokens
        if slots.numel() and can_read_values(slots):  # (a device sync: skipped while tracing or capturing)
            low, high = int(slots.min()), int(slots.max())
            if low < -1 or high >= num_slots:
                raise ValueError(f"{where}: argument 'slots' expected values in [-1, {num_slots - 1}] (-1 stays -1), "
                                 f"got {low if low < -1 else high}")
        slots = slots.long()
        block, within = torch.div(slots, self.block_tokens, rounding_mode="floor"), slots % self.block_tokens
        offsets = block * self.row_bytes + spec.offset + within * spec.token_bytes
        return torch.where(slots >= 0, offsets, torch.full_like(offsets, -1))

    # -- allocation --------------------------------------------------------------------------------
    def allocate_blocks(self, n: int) -> list[int]:
        """``n`` free rows as block ids; raises :class:`CacheFullError` (allocating nothing) if too few."""
        return self.allocator.allocate_blocks(n)

    def free_blocks(self, ids) -> None:
        """Give back block ids (an iterable: list, tensor); a bad, free or repeated id frees nothing."""
        self.allocator.free_blocks(ids)

    def allocate_state(self) -> int:
        """A state id whose KDA state (every KDA layer, recurrent and conv) is zeroed; :class:`CacheFullError` if no aligned run.

        A model without KDA layers keeps no state: every request gets id 0 and nothing is allocated."""
        if self.layout.rows_per_state == 0:
            return 0
        slot = self.allocator.allocate_state()
        rows = self.layout.rows_per_state
        self.pool[slot * rows:(slot + 1) * rows].zero_()
        return slot

    def free_state(self, state_id: int) -> None:
        if self.layout.rows_per_state == 0:
            return  # nothing was allocated (no KDA layer)
        self.allocator.free_state(state_id)

    def __repr__(self) -> str:
        lay = self.layout
        return (f"PackedKVCache({lay.model}, latent={lay.latent_fmt}, index={lay.index_fmt}, rows={self.num_rows} x "
                f"{lay.row_bytes} B, block_tokens={lay.block_tokens}, state slots={self.num_state_slots}, "
                f"free rows={self.allocator.free_rows})")


__all__ = ["PackedKVCache", "CacheFullError"]
