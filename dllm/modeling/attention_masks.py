"""Attention mask policies: which key slots a query slot may see.

Slots index the canvas (left padding included). The prompt occupies slots ``[0, P)``; the
generated region starts at ``P`` and is cut into blocks of ``B``. Block id of slot ``s``:
``0`` for ``s < P`` (the prompt is one bidirectional block), else ``1 + (s - P) // B``.

* ``bidirectional``: every query sees every valid key.
* ``block_causal``: a query in block ``b`` sees keys of blocks ``<= b`` (prompt rows see only the
  prompt; a row in generated block ``b`` sees the prompt, earlier blocks and its own block).

Both are combined with the key-padding mask, which the LLaDA reference silently drops.

For a position-aligned model (SDAR, Fast-dLLM v2) the caller passes as ``prompt_length`` the slot
where the block grid starts (``dllm.modeling.layers.block_grid_origin``), so blocks follow positions.

* ``block_diffusion`` (training only): the input is ``[noisy | clean]``, two copies of one
  sequence of ``n`` slots with the same positions (SDAR's and Fast-dLLM v2's training forward). A
  noisy query in block ``b`` sees the noisy keys of block ``b`` and the clean keys of blocks
  ``< b``; a clean query sees the clean keys of blocks ``<= b``.
"""

from __future__ import annotations

import torch


def block_ids(slots: torch.Tensor, prompt_length: int | torch.Tensor, block_size: int) -> torch.Tensor:
    """Block id of each slot; ``prompt_length`` may be a scalar or a per-row tensor [batch]."""
    if torch.is_tensor(prompt_length) and prompt_length.dim() == 1:
        p = prompt_length[:, None]
        s = slots[None, :] if slots.dim() == 1 else slots
        return torch.where(s < p, torch.zeros_like(s), 1 + torch.div(s - p, block_size, rounding_mode="floor"))
    p = int(prompt_length)
    return torch.where(slots < p, torch.zeros_like(slots), 1 + torch.div(slots - p, block_size, rounding_mode="floor"))


def build_attention_mask(
    *,
    query_slots: torch.Tensor,
    key_end: int,
    key_valid: torch.Tensor | None,
    policy: str,
    block_size: int | None,
    prompt_length: int | torch.Tensor | None,
    padded: bool | None = None,
) -> torch.Tensor | None:
    """Boolean mask [batch|1, 1, q, key_end] (True = may attend), or ``None`` when nothing is masked.

    ``padded``: whether ``key_valid`` holds a False slot, where the caller knows (None: checked here, a host
    synchronisation on CUDA)."""
    mask = None
    if policy == "block_causal":
        if prompt_length is None:
            raise ValueError("a block-causal model needs prompt_length (the slot where generation starts)")
        key_slots = torch.arange(key_end, device=query_slots.device)
        qb = block_ids(query_slots, prompt_length, block_size)
        kb = block_ids(key_slots, prompt_length, block_size)
        if qb.dim() == 1:
            mask = (kb[None, :] <= qb[:, None])[None, None]
        else:  # per-row prompt lengths
            mask = (kb[:, None, :] <= qb[:, :, None])[:, None]
    elif policy == "block_diffusion":
        mask = block_diffusion_mask(query_slots, key_end, prompt_length, block_size)
    elif policy != "bidirectional":
        raise ValueError(f"unknown attention policy {policy!r}; valid: bidirectional, block_causal, block_diffusion")
    if key_valid is not None:
        kv = key_valid[:, :key_end].to(torch.bool)
        if padded or (padded is None and not bool(kv.all())):
            pad = kv[:, None, None, :]
            mask = pad if mask is None else (mask & pad)
    return mask


def block_diffusion_mask(query_slots: torch.Tensor, key_end: int, origin: int | torch.Tensor,
                         block_size: int) -> torch.Tensor:
    """The ``[noisy | clean]`` training mask [batch|1, 1, q, key_end] (see the module docstring).

    ``key_end`` is ``2n``; ``origin`` (int or [batch]) is the slot of position 0 in the noisy half.
    """
    n = key_end // 2
    keys = torch.arange(key_end, device=query_slots.device)

    def parts(slots):
        clean = slots >= n
        local = torch.where(clean, slots - n, slots)
        if torch.is_tensor(origin) and origin.dim() == 1:
            block = torch.div(local[None, :] - origin[:, None], block_size, rounding_mode="floor")
            return clean[None, :], block
        return clean[None, :], torch.div(local - int(origin), block_size, rounding_mode="floor")[None, :]

    qc, qb = parts(query_slots)
    kc, kb = parts(keys)
    qc, qb, kc, kb = qc[:, :, None], qb[:, :, None], kc[:, None, :], kb[:, None, :]
    noisy_noisy = ~qc & ~kc & (qb == kb)
    noisy_clean = ~qc & kc & (kb < qb)
    clean_clean = qc & kc & (kb <= qb)
    return (noisy_noisy | noisy_clean | clean_clean)[:, None]
