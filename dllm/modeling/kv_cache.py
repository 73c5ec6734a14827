"""Preallocated KV cache for diffusion decoding.

One cache covers one canvas (prompt slots + generation slots, left padding included). Keys are
cached **after RoPE**: a canvas slot keeps its absolute position for the whole generation, so the
rotated key never changes meaning and nothing is re-rotated per step (the Fast-dLLM reference
caches pre-RoPE keys and rotates the whole key tensor on every call).

Every cached forward writes the K/V of its input slots ``[start, start + q)`` into the buffers and
then attends over keys ``[0, key_end)``. The decoders use three shapes of that one operation:

* ``prefix``  (Fast-dLLM prefix cache, D2F exact block cache): ``key_end = start + q``. Slots at or
  after ``start`` are scratch until ``commit`` moves ``length`` over them (D2F appends finished
  blocks this way: exact under a block-causal mask).
* ``replace`` (Fast-dLLM dual cache): ``key_end = length`` (the whole canvas); the fresh K/V of the
  span overwrite the stale ones in place and stay there for later steps.
* ``fill``: a full forward from slot 0 that (re)computes every slot; afterwards ``length`` = q.

Rows of one batch may each need their own window inside the shared input (continuous batching with a
cache whose refreshes are decided per row): :meth:`keeping` marks, for one forward, slots whose cached
K/V stay in place. The forward still computes every input slot, but attention reads the kept K/V
there, so a row's queries see exactly what they would see in a forward over its own window.

No step concatenates tensors: buffers are allocated once with the canvas capacity.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

CACHE_MODES = ("fill", "prefix", "replace")


@dataclass
class DiffusionKVCache:
    keys: list[torch.Tensor]  # per layer [batch, kv_heads, capacity, head_dim]
    values: list[torch.Tensor]
    key_valid: torch.Tensor  # [batch, capacity] bool: False on left padding
    positions: torch.Tensor  # [batch, capacity] long: RoPE position of each slot
    prompt_length: int | torch.Tensor  # slots < prompt_length form the prompt block (block-causal); or per row [batch]
    length: int = 0  # slots [0, length) hold committed K/V
    extra: dict = field(default_factory=dict)  # decoder-owned side data (e.g. Dream's stored last logit)
    keep: torch.Tensor | None = None  # [batch, capacity] bool during one forward (see :meth:`keeping`)
    _padding: tuple | None = field(default=None, repr=False, compare=False)  # (key_valid, its version, answer)

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        key_valid: torch.Tensor,
        prompt_length: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> DiffusionKVCache:
        key_valid = key_valid.to(device=device, dtype=torch.bool)
        batch, capacity = key_valid.shape
        shape = (batch, num_kv_heads, capacity, head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=key_valid.device) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=key_valid.device) for _ in range(num_layers)]
        return cls(keys, values, key_valid, positions_from_mask(key_valid), prompt_length)

    def has_padding(self) -> bool:
        """Whether any slot is invalid (left padding). Computed once per ``key_valid`` tensor, not once per
        forward: the answer is a host synchronisation on CUDA. An in-place change of ``key_valid`` is seen
        through ``Tensor._version``, except for inference-mode tensors, which keep no version (dllm replaces
        a cache's ``key_valid`` rather than change it)."""
        known = recalled_padding(self._padding, self.key_valid)
        if known is None:
            self._padding = padding_memo(self.key_valid)
            known = self._padding[2]
        return known

    @property
    def capacity(self) -> int:
        return self.key_valid.shape[1]

    @property
    def batch_size(self) -> int:
        return self.key_valid.shape[0]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[2]
        if end > self.capacity:
            raise ValueError(f"cache write [{start}, {end}) exceeds capacity {self.capacity}")
        if self.keep is not None:
            kept = self.keep[:, None, start:end, None]
            k = torch.where(kept, self.keys[layer][:, :, start:end], k)
            v = torch.where(kept, self.values[layer][:, :, start:end], v)
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v

    @contextmanager
    def keeping(self, keep: torch.Tensor | None) -> Iterator[DiffusionKVCache]:
        """For the forwards inside the block, slots where ``keep`` [batch, capacity] is True keep their
        cached K/V (None: every input slot is written, as without the block)."""
        self.keep = keep
        try:
            yield self
        finally:
            self.keep = None

    def view(self, layer: int, key_end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[layer][:, :, :key_end], self.values[layer][:, :, :key_end]

    def select_rows(self, index: torch.Tensor | list[int]) -> DiffusionKVCache:
        """A cache holding only the given batch rows, in that order (finished rows leave; LoPA forks)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.key_valid.device)
        key_valid = self.key_valid.index_select(0, index)
        unpadded = recalled_padding(self._padding, self.key_valid) is False
        return DiffusionKVCache(
            keys=[k.index_select(0, index) for k in self.keys],
            values=[v.index_select(0, index) for v in self.values],
            key_valid=key_valid,
            _padding=padding_memo(key_valid, False) if unpadded else None,  # rows of an unpadded canvas
            positions=self.positions.index_select(0, index),
            prompt_length=(self.prompt_length.index_select(0, index) if torch.is_tensor(self.prompt_length)
                           else self.prompt_length),
            length=self.length,
            extra={name: t.index_select(0, index) if torch.is_tensor(t) else t for name, t in self.extra.items()},
        )

    def clone(self) -> DiffusionKVCache:
        return self.select_rows(torch.arange(self.batch_size, device=self.key_valid.device))

    def repeat_rows(self, times: int) -> DiffusionKVCache:
        """Each row repeated ``times`` times consecutively (row r -> rows r*times .. r*times+times-1)."""
        index = torch.arange(self.batch_size, device=self.key_valid.device).repeat_interleave(times)
        return self.select_rows(index)

    def copy_rows_from(self, other: DiffusionKVCache, dst: torch.Tensor, src: torch.Tensor, end: int) -> None:
        """Copy slots ``[0, end)`` of rows ``src`` of ``other`` into rows ``dst`` of this cache."""
        for layer in range(len(self.keys)):
            self.keys[layer][dst, :, :end] = other.keys[layer][src, :, :end]
            self.values[layer][dst, :, :end] = other.values[layer][src, :, :end]


def _version(t: torch.Tensor) -> int | None:
    """The tensor's in-place change count (None for an inference-mode tensor, which keeps none)."""
    return None if t.is_inference() else t._version


def padding_memo(key_valid: torch.Tensor, padded: bool | None = None) -> tuple:
    """``(key_valid, its version, whether it holds a False slot)``: ``padded`` where the caller knows it,
    else checked here (a host synchronisation on CUDA, so callers keep the memo)."""
    return key_valid, _version(key_valid), (not bool(key_valid.all())) if padded is None else padded


def recalled_padding(memo: tuple | None, key_valid: torch.Tensor) -> bool | None:
    """The answer of a :func:`padding_memo` while it is about this ``key_valid``, unchanged; else None."""
    return memo[2] if memo is not None and memo[0] is key_valid and memo[1] == _version(key_valid) else None


def positions_from_mask(key_valid: torch.Tensor) -> torch.Tensor:
    """RoPE positions for a left-padded canvas: real tokens count from 0, pads get 0."""
    valid = key_valid.long()
    return (valid.cumsum(-1) - 1).clamp(min=0) * valid
