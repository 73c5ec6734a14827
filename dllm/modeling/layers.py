"""The building blocks of the one transformer core shared by every checkpoint format.

A format differs only in the names of its tensors, so :class:`DecoderLayer` takes a
:class:`LayerNames` map and registers its submodules under those names: ``save_pretrained`` then
writes the checkpoint's own tensor names and PEFT adapters target them directly (D2F adapters
name ``q_proj``/``attn_out`` on LLaDA, ``o_proj`` on Dream). Submodules are looked up by name at
forward time, so PEFT may swap a projection for its LoRA wrapper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention_backends import MaskSpec, attend, requested_backend, resolve_backend
from .configuration import CoreSpec
from .kv_cache import DiffusionKVCache


class RMSNorm(nn.Module):
    """Normalise in fp32, cast back to the input dtype, then scale (LLaDA and Qwen2 agree on this order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    """NeoX rotate-half RoPE; inverse frequencies and angles in fp32, whatever the model dtype."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        # Recomputed rather than stored as a buffer: a meta-device init or a bf16 cast of the
        # model must never touch these fp32 frequencies.
        idx = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device)
        return 1.0 / (self.theta ** (idx / self.head_dim))

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [batch, 1, seq, head_dim] for integer positions [batch, seq]."""
        freqs = positions.float()[..., None] * self.inv_freq(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    # Partial RoPE (LLaDA2: partial_rotary_factor 0.5): the first `rotary` dims of each head rotate
    # (rotate-half within them), the rest pass through unchanged.
    rot, rest = x[..., :rotary], x[..., rotary:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


@dataclass(frozen=True)
class LayerNames:
    attn_norm: str
    q: str
    k: str
    v: str
    o: str
    mlp_norm: str
    gate: str
    up: str
    down: str
    qkv: str | None = None  # one fused q/k/v projection (LLaDA2 ``attention.query_key_value``) instead of q, k, v
    q_norm: str | None = None  # per-head RMSNorm of q and k before RoPE (with spec.qk_norm)
    k_norm: str | None = None
    mlp: str | None = None  # where a feed-forward module passed to DecoderLayer lives (a MoE block: ``mlp``)


LLADA_LAYER_NAMES = LayerNames(
    attn_norm="attn_norm", q="q_proj", k="k_proj", v="v_proj", o="attn_out",
    mlp_norm="ff_norm", gate="ff_proj", up="up_proj", down="ff_out",
)
QWEN2_LAYER_NAMES = LayerNames(
    attn_norm="input_layernorm", q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj",
    o="self_attn.o_proj", mlp_norm="post_attention_layernorm", gate="mlp.gate_proj", up="mlp.up_proj",
    down="mlp.down_proj",
)


def _attach(root: nn.Module, path: str, module: nn.Module) -> None:
    *parents, leaf = path.split(".")
    node = root
    for name in parents:
        if not hasattr(node, name):
            node.add_module(name, nn.Module())
        node = getattr(node, name)
    node.add_module(leaf, module)


def _lookup(root: nn.Module, path: str) -> nn.Module:
    node = root
    for name in path.split("."):
        node = getattr(node, name)
    return node


@dataclass
class AttentionContext:
    """Everything a layer needs about where its queries sit and which keys they may see.

    ``mask_spec`` describes the mask; the backend (``sdpa`` | ``flex``) builds what it needs from
    it once per forward (a dense mask for SDPA, a BlockMask for FlexAttention).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    mask_spec: MaskSpec
    backend: str = "sdpa"
    cache: DiffusionKVCache | None = None
    cache_start: int = 0
    key_end: int = 0

    @property
    def mask(self) -> torch.Tensor | None:
        """The dense SDPA mask [batch|1, 1, q, key_end] (built on first use, then shared by every layer)."""
        return self.mask_spec.dense()


class DecoderLayer(nn.Module):
    """Pre-norm block: x + Attn(RMS(x)); x + FFN(RMS(x)).

    The FFN is a SwiGLU under ``names.gate/up/down``, or the module ``mlp`` (a mixture-of-experts
    block) attached under ``names.mlp``. q/k/v are three projections, or one fused projection
    under ``names.qkv`` whose output holds all q heads, then all k heads, then all v heads.
    """

    def __init__(self, spec: CoreSpec, names: LayerNames, layer_idx: int, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.names = names
        self.layer_idx = layer_idx
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.head_dim
        self.qk_norm = spec.qk_norm
        d, hd = spec.hidden_size, spec.head_dim
        _attach(self, names.attn_norm, RMSNorm(d, spec.rms_norm_eps))
        if names.qkv:
            _attach(self, names.qkv, nn.Linear(d, (spec.num_heads + 2 * spec.num_kv_heads) * hd, bias=spec.qkv_bias))
        else:
            _attach(self, names.q, nn.Linear(d, spec.num_heads * hd, bias=spec.qkv_bias))
            _attach(self, names.k, nn.Linear(d, spec.num_kv_heads * hd, bias=spec.qkv_bias))
            _attach(self, names.v, nn.Linear(d, spec.num_kv_heads * hd, bias=spec.qkv_bias))
        if spec.qk_norm:
            _attach(self, names.q_norm, RMSNorm(hd, spec.rms_norm_eps))
            _attach(self, names.k_norm, RMSNorm(hd, spec.rms_norm_eps))
        _attach(self, names.o, nn.Linear(spec.num_heads * hd, d, bias=False))
        _attach(self, names.mlp_norm, RMSNorm(d, spec.rms_norm_eps))
        if mlp is not None:
            _attach(self, names.mlp, mlp)
        else:
            _attach(self, names.gate, nn.Linear(d, spec.intermediate_size, bias=False))
            _attach(self, names.up, nn.Linear(d, spec.intermediate_size, bias=False))
            _attach(self, names.down, nn.Linear(spec.intermediate_size, d, bias=False))
        self.has_mlp_module = mlp is not None

    def _m(self, name: str) -> nn.Module:
        return _lookup(self, getattr(self.names, name))

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [b, heads, t, hd], k and v [b, kv_heads, t, hd] (q/k normalised per head when spec.qk_norm)."""
        b, t, _ = x.shape
        if self.names.qkv:
            fused = self._m("qkv")(x).view(b, t, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
            q, k, v = (part.transpose(1, 2) for part in
                       fused.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2))
        else:
            q = self._m("q")(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
            k = self._m("k")(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
            v = self._m("v")(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self._m("q_norm")(q), self._m("k_norm")(k)
        return q, k, v

    # not named `attention`: LLaDA2 checkpoints keep their attention weights under a submodule of that name
    def self_attention(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        q = apply_rope(q, ctx.cos, ctx.sin)
        k = apply_rope(k, ctx.cos, ctx.sin)
        if ctx.cache is not None:
            ctx.cache.write(self.layer_idx, ctx.cache_start, k, v)
            k, v = ctx.cache.view(self.layer_idx, ctx.key_end)
        out = attend(q, k, v, ctx.mask_spec, ctx.backend, gqa=self.num_kv_heads != self.num_heads)
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)
        return self._m("o")(out)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.has_mlp_module:
            return self._m("mlp")(h)
        return self._m("down")(F.silu(self._m("gate")(h)) * self._m("up")(h))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.self_attention(self._m("attn_norm")(x), ctx)
        return x + self.feed_forward(self._m("mlp_norm")(x))


def make_context(
    *,
    spec: CoreSpec,
    rope: RotaryEmbedding,
    dtype: torch.dtype,
    seq_len: int,
    device: torch.device,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    prompt_length: int | torch.Tensor | None,
    cache: DiffusionKVCache | None,
    cache_start: int,
    cache_mode: str | None,
    attention_policy: str | None,
    block_size: int | None = None,
    attn_backend: str | None = None,
) -> AttentionContext:
    """Resolve positions, the key range and the mask description for one forward.

    ``attn_backend`` is the requested backend (``auto`` | ``sdpa`` | ``flex`` | ``eager``, see
    :func:`~dllm.modeling.attention_backends.requested_backend`; None: ``DLLM_ATTN_BACKEND`` or
    ``auto``), resolved here for the forward's device and autograd mode.
    """
    policy = attention_policy or spec.attention_policy
    block_size = block_size or spec.block_size
    if policy == "block_causal" and not block_size:
        raise ValueError("a block-causal forward needs block_size (set it in the config or pass block_size=)")
    if cache is None:
        key_valid = attention_mask.bool() if attention_mask is not None else None
        if position_ids is None:
            if key_valid is not None:
                valid = key_valid.long()
                position_ids = (valid.cumsum(-1) - 1).clamp(min=0) * valid
            else:
                position_ids = torch.arange(seq_len, device=device)[None]
        key_end = seq_len
        start = 0
    else:
        if cache_mode not in ("fill", "prefix", "replace"):
            raise ValueError(f"cache_mode={cache_mode!r}; valid with a cache: fill, prefix, replace")
        start = 0 if cache_mode == "fill" else cache_start
        end = start + seq_len
        if end > cache.capacity:
            raise ValueError(f"input slots [{start}, {end}) exceed the cache capacity {cache.capacity}")
        key_valid = cache.key_valid
        if position_ids is None:
            position_ids = cache.positions[:, start:end]
        key_end = max(cache.length, end) if cache_mode == "replace" else end
        if prompt_length is None:
            prompt_length = cache.prompt_length
    if policy not in ("bidirectional", "block_causal", "block_diffusion"):
        raise ValueError(f"unknown attention policy {policy!r}; valid: bidirectional, block_causal, block_diffusion")
    if policy == "block_diffusion":
        if cache is not None or spec.block_alignment != "position":
            raise ValueError("attention_policy='block_diffusion' (the [noisy | clean] training forward) needs a "
                             "position-aligned block-causal model (SDAR, Fast-dLLM v2) and no cache")
        half = seq_len // 2
        prompt_length = block_grid_origin(None if key_valid is None else key_valid[:, :half], None, block_size)
        if attn_backend == "flex" or (attn_backend is None and requested_backend() == "flex"):
            attn_backend = "sdpa"  # the two-stream mask has a dense form only
    elif policy == "block_causal" and spec.block_alignment == "position":
        prompt_length = block_grid_origin(key_valid, prompt_length, block_size)
    if policy == "block_causal" and prompt_length is None:
        raise ValueError("a block-causal model needs prompt_length (the slot where generation starts)")
    padded = None  # unknown: the mask builder checks key_valid
    if cache is not None:  # the cache knows once per canvas, not once per forward (a host synchronisation)
        padded = cache.has_padding()
        key_valid = key_valid if padded else None
    spec_ = MaskSpec(
        policy=policy,
        block_size=block_size,
        prompt_length=prompt_length,
        start=start,
        q_len=seq_len,
        key_end=key_end,
        key_valid=key_valid,
        device=device,
        padded=padded,
    )
    backend = resolve_backend(attn_backend or requested_backend(), device, dtype)
    if policy == "block_diffusion" and backend == "flex":
        backend = "sdpa"
    if position_ids.dim() == 1:
        position_ids = position_ids[None]
    cos, sin = rope(position_ids, dtype)
    return AttentionContext(cos=cos, sin=sin, mask_spec=spec_, backend=backend, cache=cache, cache_start=start,
                            key_end=key_end)


def block_grid_origin(key_valid: torch.Tensor | None, anchor: int | torch.Tensor | None,
                      block_size: int) -> int | torch.Tensor:
    """Slot where a position-aligned model's block grid starts, per row (the mask's block origin).

    Without ``anchor`` the grid starts at each row's first valid slot: blocks hold positions
    ``[kB, (k+1)B)``, the prompt included, as SDAR and Fast-dLLM v2 are trained and as their own
    decoders run. With ``anchor`` (the slot where generation starts) the grid is moved back by less
    than a block so that a boundary falls at the anchor: generation starts on a fresh block and the
    prompt keeps a block-causal grid (positions ``[kB - d, (k+1)B - d)``, ``d = len % B``), which
    is what the decoders built on a block grid from the prompt end (threshold, d2f, ...) need.
    """
    first = 0 if key_valid is None else key_valid.long().argmax(-1)
    if anchor is None:
        return first
    if torch.is_tensor(first) and torch.is_tensor(anchor):
        anchor = anchor.to(first.device)
    prompt = anchor - first
    blocks = (torch.div(prompt + block_size - 1, block_size, rounding_mode="floor") if torch.is_tensor(prompt)
              else -(-prompt // block_size))
    return anchor - block_size * blocks
