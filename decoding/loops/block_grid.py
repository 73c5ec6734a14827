"""What the decoders of position-aligned block-causal models share: the row's block grid and the token choice.

SDAR and Fast-dLLM v2 checkpoints attend in blocks of positions ``[kB, (k+1)B)`` counted from each
row's first token, and their own decoders decode exactly those blocks: the first one holds the end
of the prompt and the first masks. In a left-padded canvas whose prompts all end at slot ``P``, row
``r`` (first valid slot ``o_r``) has its first decoded block at ``s0_r = o_r + B * floor((P - o_r) / B)``,
``c_r = P - s0_r`` prompt slots into it. Rows of different prompt lengths decode their block ``k``
in the same forward, which covers the union of their windows; each row reads only its own window,
and attention never crosses rows, so a row commits the same tokens in the same forwards as alone.
"""

from __future__ import annotations

import torch


def first_block_starts(key_valid: torch.Tensor, prompt_end: int, block_size: int) -> torch.Tensor:
    """[batch] slot where each row's first decoded block starts (the block holding slot ``prompt_end``)."""
    first = key_valid.long().argmax(-1)
    return first + block_size * torch.div(prompt_end - first, block_size, rounding_mode="floor")


def windows(starts: torch.Tensor, k: int, width: int, lo: int, hi: int) -> torch.Tensor:
    """[batch, hi - lo] bool: the slots of span ``[lo, hi)`` inside each row's ``[start + k*width, + width)``."""
    slots = torch.arange(lo, hi, device=starts.device)[None, :]
    begin = (starts + k * width)[:, None]
    return (slots >= begin) & (slots < begin + width)


def choose(logits: torch.Tensor, *, temperature: float, top_k: int | None, top_p: float | None,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, confidence) as SDAR's ``generate.py`` and Fast-dLLM v2's ``sample_with_top_p`` choose them.

    The probabilities are computed in the logits' precision (float32), as both references do, so a
    threshold comparison sees the same numbers. At temperature 0: the argmax and its softmax
    probability. Otherwise: ``logits / T``, top-k, then nucleus top-p, a draw from the renormalised
    distribution, and the drawn token's probability under it.
    """
    logits = logits.float()
    if temperature <= 0:
        p = torch.softmax(logits, dim=-1)
        token = p.argmax(dim=-1)
        return token, torch.gather(p, -1, token[..., None]).squeeze(-1)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(int(top_k), logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        drop = cum > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
    p = torch.softmax(logits, dim=-1)
    flat = p.reshape(-1, p.shape[-1])
    token = torch.multinomial(flat, 1, generator=generator).reshape(p.shape[:-1])
    return token, torch.gather(p, -1, token[..., None]).squeeze(-1)
