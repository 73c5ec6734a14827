"""Attention backends: SDPA with a dense mask (reference, CPU) and FlexAttention with a BlockMask (CUDA).

A forward no longer carries a mask tensor but a :class:`MaskSpec`: the *description* of which keys
each query may see (policy, prompt length per row, block size, the query slot offset ``start``, the
key range ``[0, key_end)`` and the key-padding vector). Each backend turns it into what it needs:

* ``sdpa``: the dense boolean mask of :func:`~dllm.modeling.attention_masks.build_attention_mask`,
  built lazily once per forward (not per layer) and passed to ``F.scaled_dot_product_attention``.
  This is the path every CPU forward takes by default, bit-identical to the code before backends.
* ``flex``: ``torch.nn.attention.flex_attention`` with a ``mask_mod`` expressing the same rule and a
  :class:`BlockMask` computed from block-level statistics only: per key its block id and validity
  (a vector per row), never a [q x key_end] tensor. On CUDA ``flex_attention`` is compiled once
  (``torch.compile``, automatic dynamic shapes: the first new shape recompiles with symbolic
  lengths, later decoding steps reuse that graph). Elsewhere it runs eagerly (the test reference).

* ``eager``: the same dense mask, explicit ``q @ k^T``, a float32 softmax and ``p @ v``. On CPU
  its backward is about 4x faster than SDPA's flash kernel at the small head sizes and short
  sequences of the bundled models in bf16 (1.4x per training step; in float32 the two are on par;
  benchmarks/attention_backward.py).

Selection, highest priority first: the ``attn_backend=`` argument of a forward, the environment
variable ``DLLM_ATTN_BACKEND``, ``model.set_attention_backend(...)``, a ``attn_backend`` attribute
of the model config, then ``"auto"``. ``auto`` is ``flex`` for CUDA inference forwards (no autograd)
when FlexAttention is available, ``eager`` for CPU forwards with autograd in bf16/fp16 (training
under autocast), ``sdpa`` otherwise (CPU decoding, CPU float32 training, and CUDA training, whose
compiled flex backward is not verified here).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .attention_masks import build_attention_mask

ATTN_BACKENDS = ("auto", "sdpa", "flex", "eager")
ENV_VAR = "DLLM_ATTN_BACKEND"
FLEX_BLOCK = 128  # BlockMask tile (the FlexAttention default sparse block size)

try:  # FlexAttention exists from torch 2.5; the block-level constructor is private API.
    from torch.nn.attention.flex_attention import (
        BlockMask,
        create_block_mask,
        flex_attention,
    )
except ImportError:  # pragma: no cover - old torch
    BlockMask = create_block_mask = flex_attention = None
try:
    from torch.nn.attention.flex_attention import _dense_to_ordered
except ImportError:  # pragma: no cover - private API moved: fall back to create_block_mask
    _dense_to_ordered = None


def flex_available() -> bool:
    return flex_attention is not None


def check_backend(name: str, what: str = "attn_backend") -> str:
    if name not in ATTN_BACKENDS:
        raise ValueError(f"{what}={name!r}; valid: {', '.join(ATTN_BACKENDS)}")
    return name


def requested_backend(model_choice: str | None = None, call_choice: str | None = None) -> str:
    """The backend asked for (may be ``auto``): call argument > env ``DLLM_ATTN_BACKEND`` > model > auto."""
    if call_choice:
        return check_backend(call_choice)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return check_backend(env, ENV_VAR)
    return check_backend(model_choice or "auto")


_HALF = (torch.bfloat16, torch.float16)


def _computes_in_half(device: torch.device, dtype: torch.dtype | None) -> bool:
    if dtype in _HALF:
        return True
    return torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) in _HALF


def resolve_backend(requested: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """``sdpa``, ``flex`` or ``eager`` for a forward on ``device`` (``auto``: see the module docstring).

    ``dtype`` is the model's compute dtype; autocast is read from torch's state.
    """
    if requested == "auto":
        if device.type == "cpu":
            # SDPA's CPU flash backward is slow only in 16-bit; in float32 the two are on par
            return "eager" if torch.is_grad_enabled() and _computes_in_half(device, dtype) else "sdpa"
        use_flex = device.type == "cuda" and flex_available() and not torch.is_grad_enabled()
        return "flex" if use_flex else "sdpa"
    if requested == "flex" and not flex_available():  # pragma: no cover - old torch
        raise RuntimeError("attn_backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5)")
    return requested


@dataclass
class MaskSpec:
    """Which keys each query of one forward may see; the backends build their masks from it.

    Queries are canvas slots ``[start, start + q_len)``, keys slots ``[0, key_end)``. ``key_valid``
    [batch, >= key_end] is False on left padding (None: no padding). ``prompt_length`` is an int or
    a per-row tensor [batch] (block-causal only).
    """

    policy: str
    block_size: int | None
    prompt_length: int | torch.Tensor | None
    start: int
    q_len: int
    key_end: int
    key_valid: torch.Tensor | None
    device: torch.device
    padded: bool | None = None  # whether key_valid holds a False slot, where known (None: checked on use)
    _dense: object = field(default=None, repr=False)
    _block: object = field(default=None, repr=False)
    dense_builds: int = 0  # how many times the dense mask was built (once per forward at most)

    @property
    def causal(self) -> bool:
        return self.policy == "block_causal"

    def dense(self) -> torch.Tensor | None:
        """The SDPA mask [batch|1, 1, q, key_end] (None when nothing is masked), built on first use."""
        if self._dense is None:
            self.dense_builds += 1
            mask = build_attention_mask(
                query_slots=torch.arange(self.start, self.start + self.q_len, device=self.device),
                key_end=self.key_end,
                key_valid=self.key_valid,
                policy=self.policy,
                block_size=self.block_size,
                prompt_length=self.prompt_length,
                padded=self.padded,
            )
            self._dense = (mask,)
        return self._dense[0]

    def block_mask(self, batch: int):
        """The FlexAttention BlockMask (None: every query sees every key), built on first use."""
        if self._block is None:
            self._block = (flex_block_mask(self, batch),)
        return self._block[0]


# --- FlexAttention mask ------------------------------------------------------------------------
def _row_prompt_lengths(spec: MaskSpec, batch: int) -> torch.Tensor:
    p = spec.prompt_length
    if p is None:
        raise ValueError("a block-causal model needs prompt_length (the slot where generation starts)")
    if torch.is_tensor(p) and p.dim() >= 1:
        p = p.to(device=spec.device, dtype=torch.long).reshape(-1)
        return p.expand(batch) if p.numel() == 1 else p
    return torch.full((batch,), int(p), dtype=torch.long, device=spec.device)


def _block_ids(slots: torch.Tensor, p: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block id (the rule of attention_masks.block_ids) of slots [..] for per-row prompt lengths p [batch, 1]."""
    return torch.where(slots < p, torch.zeros_like(slots), 1 + torch.div(slots - p, block_size, rounding_mode="floor"))


def _mask_mod_causal_padded(p_key, p_query, valid, block_size):
    def mask_mod(b, h, q_idx, kv_idx):
        pq, pk = p_query[b], p_key[b]
        qb = torch.where(q_idx < pq, 0, 1 + (q_idx - pq) // block_size)
        kb = torch.where(kv_idx < pk, 0, 1 + (kv_idx - pk) // block_size)
        return (kb <= qb) & valid[b, kv_idx]

    return mask_mod


def _mask_mod_causal(p_key, p_query, block_size):
    def mask_mod(b, h, q_idx, kv_idx):
        pq, pk = p_query[b], p_key[b]
        qb = torch.where(q_idx < pq, 0, 1 + (q_idx - pq) // block_size)
        kb = torch.where(kv_idx < pk, 0, 1 + (kv_idx - pk) // block_size)
        return kb <= qb

    return mask_mod


def _mask_mod_padded(valid):
    def mask_mod(b, h, q_idx, kv_idx):
        return valid[b, kv_idx]

    return mask_mod


def flex_mask_mod(spec: MaskSpec, batch: int):
    """The ``mask_mod`` of ``spec`` (None when nothing is masked).

    Everything that changes between decoding steps (prompt lengths, the query offset, padding) is
    a captured *tensor*, so a compiled kernel is reused across steps instead of being specialised
    on Python ints. The query offset is folded into ``p_query = prompt_length - start``: query
    index ``i`` is slot ``start + i``, and ``(start + i) - P == i - (P - start)``.
    """
    valid = None
    if spec.key_valid is not None:
        n = -(-spec.key_end // FLEX_BLOCK) * FLEX_BLOCK  # kernels may probe indices up to the tile edge
        valid = F.pad(spec.key_valid[:, : spec.key_end].to(torch.bool), (0, n - spec.key_end))
        if valid.shape[0] != batch:
            valid = valid.expand(batch, -1)
    if spec.causal:
        p_key = _row_prompt_lengths(spec, batch)
        p_query = p_key - spec.start
        if valid is None:
            return _mask_mod_causal(p_key, p_query, int(spec.block_size))
        return _mask_mod_causal_padded(p_key, p_query, valid, int(spec.block_size))
    if spec.policy != "bidirectional":
        raise ValueError(f"unknown attention policy {spec.policy!r}; valid: bidirectional, block_causal")
    return None if valid is None else _mask_mod_padded(valid)


def block_tables(spec: MaskSpec, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) int8 [batch, 1, q_blocks, kv_blocks]: which FLEX_BLOCK tiles are partly / fully visible.

    Computed from per-key vectors only. ``kb`` is non-decreasing in the slot, so a tile (queries
    Q, keys K) is fully visible iff it is complete, all its keys are valid and ``max kb(K) <=
    min qb(Q)``; it is non-empty iff some *valid* key k in K has ``kb(k) <= max qb(Q)``. Incomplete
    edge tiles are never full (as in ``create_block_mask``, which pads with False).
    """
    q, kv, t = spec.q_len, spec.key_end, FLEX_BLOCK
    nq, nk = -(-q // t), -(-kv // t)
    dev = spec.device
    q_slots = torch.arange(nq * t, device=dev)
    k_slots = torch.arange(nk * t, device=dev)
    q_in = (q_slots < q).view(nq, t)
    k_in = k_slots < kv
    if spec.key_valid is not None:
        k_ok = F.pad(spec.key_valid[:, :kv].to(torch.bool), (0, nk * t - kv)).expand(batch, -1)
    else:
        k_ok = k_in[None].expand(batch, -1)
    k_ok = k_ok.reshape(batch, nk, t)
    k_complete = k_in.view(nk, t).all(-1)  # [nk]
    q_complete = q_in.all(-1)  # [nq]
    if spec.causal:
        p = _row_prompt_lengths(spec, batch)[:, None]
        qb = _block_ids(spec.start + q_slots[None], p, int(spec.block_size)).view(batch, nq, t)
        kb = _block_ids(k_slots[None], p, int(spec.block_size)).view(batch, nk, t)
        big = torch.iinfo(torch.long).max
        qb_max = torch.where(q_in[None], qb, -1).amax(-1)  # [batch, nq]
        qb_min = torch.where(q_in[None], qb, big).amin(-1)
        kb_min_valid = torch.where(k_ok, kb, big).amin(-1)  # [batch, nk]
        kb_max = kb.amax(-1)
        nonempty = kb_min_valid[:, None, :] <= qb_max[:, :, None]
        full = kb_max[:, None, :] <= qb_min[:, :, None]
    else:
        nonempty = k_ok.any(-1)[:, None, :].expand(batch, nq, nk)
        full = torch.ones(batch, nq, nk, dtype=torch.bool, device=dev)
    full = full & k_ok.all(-1)[:, None, :] & k_complete[None, None, :] & q_complete[None, :, None]
    partial = nonempty & ~full
    return partial[:, None].to(torch.int8), full[:, None].to(torch.int8)


def flex_block_mask(spec: MaskSpec, batch: int):
    """The BlockMask of ``spec`` for ``batch`` rows, or None when every query sees every key."""
    mask_mod = flex_mask_mod(spec, batch)
    if mask_mod is None:
        return None
    if _dense_to_ordered is None:  # pragma: no cover - private API gone: the public (compiled) route
        build = torch.compile(create_block_mask) if spec.device.type == "cuda" else create_block_mask
        return build(mask_mod, batch, None, spec.q_len, spec.key_end, device=spec.device)
    partial, full = block_tables(spec, batch)
    kv_num, kv_idx = _dense_to_ordered(partial)
    full_num, full_idx = _dense_to_ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(FLEX_BLOCK, FLEX_BLOCK), mask_mod=mask_mod,
        seq_lengths=(spec.q_len, spec.key_end),
        compute_q_blocks=torch.is_grad_enabled(),  # the transposed tables serve the backward only
    )


# --- kernels ------------------------------------------------------------------------------------
_COMPILED: dict[tuple, object] = {}
_BROKEN: dict[tuple, str] = {}


def _flex_fn(q: torch.Tensor, gqa: bool):
    """Compiled flex_attention on CUDA (one wrapper per signature), eager elsewhere.

    The signature holds what the kernel is specialised on anyway (device, dtype, head dim, GQA);
    sequence lengths and batch are left to dynamo's automatic dynamic shapes, so a decoding run
    compiles at most twice per signature (first shape static, second shape dynamic) instead of
    once per step.
    """
    if q.device.type != "cuda" or torch.compiler.is_compiling() or os.environ.get("DLLM_FLEX_COMPILE", "1") == "0":
        return flex_attention
    sig = flex_signature(q, gqa)
    fn = _COMPILED.get(sig)
    if fn is None:
        # Every wrapper shares flex_attention's code object and so one dynamo cache: each mask_mod
        # variant (causal / padded / both), the short-query decode kernel and the static-then-
        # dynamic pair take an entry. Leave room for them before dynamo gives up and runs eagerly.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        fn = _COMPILED[sig] = torch.compile(flex_attention, dynamic=None)
    return fn


def flex_signature(q: torch.Tensor, gqa: bool) -> tuple:
    return (q.device.type, q.dtype, q.shape[-1], gqa)


FLEX_MIN_HEAD_DIM_CUDA = 16  # Inductor's flex kernel: "embedding dimension ... must be at least 16" (torch 2.11)


def flex_kernel_supports(device_type: str, head_dim: int) -> bool:
    """Whether the compiled CUDA flex kernel takes this head size (eager flex elsewhere takes any)."""
    return device_type != "cuda" or head_dim >= FLEX_MIN_HEAD_DIM_CUDA


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: MaskSpec, backend: str, gqa: bool) -> torch.Tensor:
    """Attention output [batch, heads, q, head_dim] of one layer under ``spec``."""
    if backend == "flex" and not flex_kernel_supports(q.device.type, q.shape[-1]):
        backend = "sdpa"  # known unsupported: skip the doomed compile and its warning
    if backend == "flex":
        sig = flex_signature(q, gqa)
        if sig not in _BROKEN:
            try:
                return _flex_fn(q, gqa)(q, k, v, block_mask=spec.block_mask(q.shape[0]), enable_gqa=gqa)
            except Exception as err:  # a failed compile must not lose the forward
                if q.device.type != "cuda":
                    raise
                _BROKEN[sig] = repr(err)
                warnings.warn(f"flex attention failed for {sig} ({err!r}); using SDPA for it from now on",
                              stacklevel=2)
    elif backend == "eager":
        return eager_attention(q, k, v, spec.dense(), gqa)
    elif backend != "sdpa":
        raise ValueError(f"attention backend {backend!r}; valid here: sdpa, flex, eager")
    return F.scaled_dot_product_attention(q, k, v, attn_mask=spec.dense(), is_causal=False, enable_gqa=gqa)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                    gqa: bool) -> torch.Tensor:
    """SDPA's result computed with plain matmuls; the softmax runs in float32 whatever q's dtype.

    A query that may see no key (a left-padding slot in front of a position-aligned block grid) gets
    zeros, as from SDPA and FlexAttention, instead of a NaN row whose zero-weighted values would
    leak into every other row at the next layer.
    """
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.float().softmax(-1)
    if mask is not None:
        probs = probs.masked_fill(~mask.any(-1, keepdim=True), 0.0)
    return torch.matmul(probs.to(v.dtype), v)
