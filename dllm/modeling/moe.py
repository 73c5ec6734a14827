"""Mixture-of-experts feed-forward blocks: the routers of the MoE families and the expert dispatch.

A block runs in three steps: a router picks ``k`` experts per token and their weights, every
expert runs its SwiGLU on the tokens routed to it, and each token's ``k`` outputs are summed with
the weights. The routers reproduce their reference modeling code exactly (which experts run is
decided by it, so a wrong tie-break or a bias in the wrong place changes the model):

* :func:`route_sigmoid_grouped` (LLaDA2.x, BailingMoeV2): sigmoid scores in float32; the expert
  bias is added for *selection only*; experts are chosen inside the ``topk_group`` best of
  ``n_group`` groups (a group's score is the sum of its two best biased scores); the chosen
  experts' unbiased scores are renormalised to sum 1 (always, whatever ``norm_topk_prob`` says:
  the reference ignores that field) and multiplied by ``routed_scaling_factor``.
* :func:`route_softmax` (LLaDA-MoE, OLMoE-style; SDAR-MoE, Qwen3-MoE-style): softmax over all experts
  in float32; an expert bias, when the checkpoint has one, is added to the probabilities and the
  biased values are the weights; renormalised to sum 1 only with ``norm_topk_prob`` (LLaDA-MoE's
  reference hard-codes it off, SDAR-MoE's reads it from the config).

The dispatch (:class:`Experts`) has three interchangeable paths, equal up to float summation order
(tests/dllm/test_moe_families.py; on CUDA too): ``loop`` (one boolean selection per expert: readable,
the CPU default), ``sorted`` (token slots sorted by expert, one contiguous slice per expert that
received tokens: no per-expert masks) and ``grouped`` (the sorted slices through
``torch._grouped_mm``, one kernel per projection, with the expert weights stacked on every call).
``auto`` takes ``grouped`` on CUDA when no gradient is needed and the experts are plain
``nn.Linear`` (no LoRA), else ``sorted`` on CUDA and ``loop`` on CPU: ``loop`` and ``sorted`` call
each expert's own modules, so LoRA adapters on expert projections work there. One LLaDA2.0-mini
MoE layer (256 experts of 512, top-8, bf16) on an H100 took, for 32 / 256 / 2048 tokens, 24 / 32 / 36
ms with ``loop``, 10 / 17 / 17 ms with ``sorted`` and 2.0 / 2.2 / 2.7 ms with ``grouped``, the
stacking included (2026-12-05, torch 2.11; docs/results/gpu/moe-dispatch-h100-2026-12-05.json).
The path can be forced with ``DLLM_MOE_PATH`` or a block's ``moe_path`` attribute.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

MOE_PATHS = ("auto", "loop", "sorted", "grouped")
ENV_VAR = "DLLM_MOE_PATH"


@dataclass(frozen=True)
class ExpertLayout:
    """Where a mixture-of-experts config puts its routed experts (``dllm info``, active parameters)."""

    routed: int  # routed experts per MoE layer
    top_k: int  # routed experts each token runs
    moe_layers: int  # layers whose feed-forward is a MoE block ...
    layers: int  # ... of this many
    expert_parameters: int  # one routed expert's weights (a SwiGLU: 3 x hidden x width)

    @property
    def idle_parameters(self) -> int:
        """Routed-expert weights a token does not run: a model's parameters minus these are its active ones."""
        return self.moe_layers * (self.routed - self.top_k) * self.expert_parameters

    def __str__(self) -> str:
        return f"{self.routed} routed, top {self.top_k}, in {self.moe_layers} of {self.layers} layers"


def expert_layout(config, width: int) -> ExpertLayout | None:
    """The layout of a config with ``num_experts``, ``num_experts_per_tok``, ``num_hidden_layers``, ``hidden_size``
    and ``is_moe_layer(i)``, whose routed experts are SwiGLUs of ``width``; None when no layer is a MoE one."""
    layers = config.num_hidden_layers
    moe_layers = sum(bool(config.is_moe_layer(i)) for i in range(layers))
    if not moe_layers or not config.num_experts:
        return None
    return ExpertLayout(config.num_experts, config.num_experts_per_tok, moe_layers, layers, 3 * config.hidden_size * width)


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` under the names every MoE checkpoint uses for it."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def route_sigmoid_grouped(
    logits: torch.Tensor, expert_bias: torch.Tensor | None, *, top_k: int, n_group: int, topk_group: int,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [n, k], weights [n, k] float32) from router logits [n, E] (float32), LLaDA2's rule."""
    n, num_experts = logits.shape
    scores = torch.sigmoid(logits.float())
    biased = scores + expert_bias.float() if expert_bias is not None else scores
    if n_group > 1:
        group_scores = biased.view(n, n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
        groups = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_scores).scatter_(1, groups, 1.0).bool()
        keep = keep[:, :, None].expand(n, n_group, num_experts // n_group).reshape(n, num_experts)
        biased = biased.masked_fill(~keep, float("-inf"))
    ids = torch.topk(biased, k=top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if top_k > 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return ids, weights * routed_scaling_factor


def route_softmax(
    logits: torch.Tensor, expert_bias: torch.Tensor | None, *, top_k: int, norm_topk_prob: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [n, k], weights [n, k] float32), LLaDA-MoE's (OLMoE) rule: the bias, if any, is
    added to the softmax probabilities and stays in the weights."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    if expert_bias is not None:
        probs = probs + expert_bias.float()
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return ids, weights


def requested_path(choice: str | None = None) -> str:
    path = choice or os.environ.get(ENV_VAR, "").strip() or "auto"
    if path not in MOE_PATHS:
        raise ValueError(f"MoE dispatch path {path!r} ({ENV_VAR} or moe_path); valid: {', '.join(MOE_PATHS)}")
    return path


class Experts(nn.ModuleList):
    """``num_experts`` SwiGLU experts (tensor names ``experts.{i}.{gate,up,down}_proj``) and their dispatch."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__(SwiGLU(hidden, intermediate) for _ in range(num_experts))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, *, path: str = "auto",
                accumulate: torch.dtype | None = torch.float32) -> torch.Tensor:
        """Σ_j weights[:, j] * expert_{ids[:, j]}(x) for tokens x [n, d].

        ``accumulate``: the dtype of the weighted sum (LLaDA2 sums in float32 and casts back; None
        casts the weights to x's dtype first and sums in it, as LLaDA-MoE does).
        """
        path = requested_path(path)
        if path == "auto":
            plain = all(type(getattr(e, n)) is nn.Linear for e in self for n in ("gate_proj", "up_proj", "down_proj"))
            path = ("grouped" if plain and not torch.is_grad_enabled() else "sorted") if x.is_cuda else "loop"
        n, k = ids.shape
        flat = ids.reshape(-1)  # slot j of token t is row t * k + j
        if path == "loop":
            out = self._per_slot_loop(x, flat, k)
        elif path == "sorted":
            out = self._per_slot_sorted(x, flat, k)
        else:
            out = self._per_slot_grouped(x, flat, k)
        out = out.view(n, k, -1)
        if accumulate is None:
            return (out * weights.to(x.dtype)[..., None]).sum(dim=1)
        return (out.to(accumulate) * weights.to(accumulate)[..., None]).sum(dim=1).to(x.dtype)

    def _per_slot_loop(self, x: torch.Tensor, flat: torch.Tensor, k: int) -> torch.Tensor:
        out = x.new_zeros(flat.shape[0], x.shape[-1])
        for e, expert in enumerate(self):
            slots = (flat == e).nonzero().flatten()
            if slots.numel():
                out[slots] = expert(x[slots // k]).to(out.dtype)
        return out

    def _sorted_slots(self, flat: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=len(self)).tolist()  # one host sync per block
        return order, counts

    def _per_slot_sorted(self, x: torch.Tensor, flat: torch.Tensor, k: int) -> torch.Tensor:
        order, counts = self._sorted_slots(flat)
        tokens = x[order // k]
        parts, start = [], 0
        for e, count in enumerate(counts):
            if count:
                parts.append(self[e](tokens[start : start + count]).to(x.dtype))
                start += count
        out = torch.empty_like(tokens)
        out[order] = torch.cat(parts) if parts else tokens[:0]
        return out

    def _per_slot_grouped(self, x: torch.Tensor, flat: torch.Tensor, k: int) -> torch.Tensor:
        order, counts = self._sorted_slots(flat)
        tokens = x[order // k]
        offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
        gate = torch.stack([e.gate_proj.weight for e in self]).transpose(1, 2)  # [E, d, I]
        up = torch.stack([e.up_proj.weight for e in self]).transpose(1, 2)
        down = torch.stack([e.down_proj.weight for e in self]).transpose(1, 2)  # [E, I, d]
        h = F.silu(torch._grouped_mm(tokens, gate, offs=offs)) * torch._grouped_mm(tokens, up, offs=offs)
        out = torch.empty_like(tokens)
        out[order] = torch._grouped_mm(h, down, offs=offs)
        return out
