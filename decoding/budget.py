"""What a ``generate`` call will hold in memory, estimated before any tensor is allocated, and the check
that refuses a call the device cannot hold with the estimate and what to lower.

The dominant terms, per canvas row (a LoPA branch is a row too: ``rows x (lopa_branches + 1)``):

* the KV cache: every layer keeps K and V for every slot (prompt + canvas rounded up to whole blocks),
  ``2 x layers x kv_heads x head_dim`` values per slot, in the model's dtype;
* one forward's activations: the logits of the slots it scores (fp32 for the softmax) and the attention
  scores of one layer (``heads x q x keys``), plus a few hidden-state copies.

It is an estimate (allocator slack, library workspaces), meant to stop a request that would need tens of
gigabytes before it starts, not to pack memory tightly: ``generate`` refuses a call that would use more than
``MEMORY_FRACTION`` of the memory available now.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import GenerationConfigError

MEMORY_FRACTION = 0.8  # of the memory available when the call starts


@dataclass(frozen=True)
class MemoryEstimate:
    rows: int  # canvas rows, LoPA branches included
    slots: int  # slots per row: prompt + canvas
    kv_bytes: int
    forward_bytes: int

    @property
    def total(self) -> int:
        return self.kv_bytes + self.forward_bytes


def branch_factor(cfg) -> int:
    """Canvas rows per prompt row: LoPA verifies ``lopa_branches`` lookahead branches beside the anchor."""
    from .registry import get_strategy

    return get_strategy(cfg.strategy).canvas_rows(cfg)


def slot_bytes(model) -> int:
    """KV-cache bytes of one slot of one row, over all layers."""
    spec = model.spec
    dtype = model.get_input_embeddings().weight.dtype
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * torch.finfo(dtype).bits // 8


def estimate(model, rows: int, prompt_length: int, cfg) -> MemoryEstimate:
    """The memory of a call decoding ``rows`` prompts of ``prompt_length`` tokens with ``cfg``."""
    spec = model.spec
    n = rows * branch_factor(cfg)
    slots = prompt_length + cfg.canvas_tokens
    dtype_bytes = torch.finfo(model.get_input_embeddings().weight.dtype).bits // 8
    window = slots if cfg.cache == "none" and not model.is_block_causal else min(slots, 2 * cfg.block_size)
    logits = n * window * spec.vocab_size * 4  # fp32 for the softmax
    scores = n * spec.num_heads * window * slots * 4
    hidden = 4 * n * slots * max(spec.hidden_size, spec.intermediate_size) * dtype_bytes
    return MemoryEstimate(n, slots, n * slots * slot_bytes(model), logits + scores + hidden)


def available_bytes(device: torch.device) -> int | None:
    """Memory free for this process on ``device`` now (None when it cannot be read)."""
    try:
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[0])
        import psutil  # an accelerate dependency

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no reading: no check
        return None


def check_memory(model, rows: int, prompt_length: int, cfg) -> MemoryEstimate:
    """GenerationConfigError before any allocation when the call would not fit the memory available."""
    est = estimate(model, rows, prompt_length, cfg)
    device = model.get_input_embeddings().weight.device
    free = available_bytes(device)
    if free is not None and est.total > MEMORY_FRACTION * free:
        branches = f" x {branch_factor(cfg)} LoPA branches" if branch_factor(cfg) > 1 else ""
        raise GenerationConfigError(
            f"this call needs about {_gib(est.total)} ({rows} rows{branches} x {est.slots} slots: "
            f"{_gib(est.kv_bytes)} of KV cache, {_gib(est.forward_bytes)} per forward) but {device.type} has "
            f"{_gib(free)} free; decode fewer rows at a time, fewer lopa_branches or a smaller max_new_tokens")
    return est


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"
