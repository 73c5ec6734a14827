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

from dllm.decoding.joining import poll


def first_block_starts(key_valid: torch.Tensor, prompt_end: int, block_size: int) -> torch.Tensor:
    """[batch] slot where each row's first decoded block starts (the block holding slot ``prompt_end``)."""
    first = key_valid.long().argmax(-1)
    return first + block_size * torch.div(prompt_end - first, block_size, rounding_mode="floor")


def windows(starts: torch.Tensor, k: int, width: int, lo: int, hi: int) -> torch.Tensor:
    """[batch, hi - lo] bool: the slots of span ``[lo, hi)`` inside each row's ``[start + k*width, + width)``."""
    slots = torch.arange(lo, hi, device=starts.device)[None, :]
    begin = (starts + k * width)[:, None]
    return (slots >= begin) & (slots < begin + width)


def join_at_boundary(state, runner, cache, cached_end: int, cur: torch.Tensor, budget: torch.Tensor):
    """A block boundary of a joining call (``dllm.decoding.joining``), ``cur`` holding each row's next block
    start and ``budget`` the end of its ``max_new_tokens`` slots: rows with no block left leave
    (``"length"``) and the waiting rows join.

    A new prompt of ``n`` tokens is placed so that its first block (the one holding its last ``n % B``
    tokens) starts at or after the slowest row's next block, and the next forward is fed from the new
    prompts' first slot: it computes their K/V (the other rows' final slots again, from the same tokens:
    exact under the block-causal mask) in the forward that is the new row's first one when it runs alone.
    Returns ``(cur, budget, cache, cached_end)`` for the re-laid-out canvas.
    """
    if state.live:
        done = cur >= budget
        if bool(done.any()):
            keep = state.retire(done, reason="length")
            cur, budget = cur[keep], budget[keep]
            runner.select_rows(keep)
            cache = cache.select_rows(keep)
    if not state.incoming:
        return cur, budget, cache, cached_end
    B = state.cfg.block_size
    lengths = [len(p) for p, _ in state.incoming]
    place_at = (int(cur.min()) if state.live else state.x.shape[1]) + max(n % B for n in lengths)
    _, shift, cache = poll(state, place_at=place_at, runner=runner, cache=cache)
    place_at -= shift
    new_cur = torch.tensor([place_at - n % B for n in lengths], dtype=cur.dtype, device=cur.device)
    cur = torch.cat([cur - shift, new_cur])
    budget = torch.cat([budget - shift, torch.full_like(new_cur, place_at + state.limit)])
    return cur, budget, cache, max(0, min(cached_end - shift, place_at - max(lengths)))


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
