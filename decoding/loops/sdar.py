"""SDAR / TraDo / LightningRL block decoding (strategy ``sdar``): SDAR's ``block_diffusion_generate``.

The model's own blocks are decoded left to right (``decoding.loops.block_grid``); inside a block each
forward commits, among the block's masked slots,

* ``low_confidence_static``: the ``q_step`` most confident tokens, where the quota spreads the block
  length over ``denoising_steps`` (``block // steps`` each, the first ``block % steps`` steps one
  more; SDAR's ``get_num_transfer_tokens``);
* ``low_confidence_dynamic`` (the default): every token whose probability exceeds ``threshold``
  if there are at least ``q_step`` of them, else the ``q_step`` most confident.

Finished blocks are cached exactly (their K/V depend on earlier blocks only). Where SDAR's loop spends
one more forward per block to store the finished block's K/V (``store_kv=True``), dllm computes them
in the next block's first forward, which feeds both blocks: the tokens are the same and the count of
forwards is SDAR's count of denoising forwards. A prompt's complete blocks are computed the same way
(SDAR prefills them in a forward of their own).

Differences from the reference, each outside what it does correctly:

* its ``generate.py`` samples even at temperature 0 (it divides by the temperature); dllm's
  temperature 0 is the limit: the argmax and its softmax probability;
* when a step's quota exceeds the masked slots left (a first block holding prompt tokens, or a
  dynamic step after a large commit), ``torch.topk`` there also picks unmasked slots and overwrites
  them, prompt tokens included, with the model's prediction; dllm commits only masked slots;
* it stops after the block holding a stop id; dllm stops a row once everything before its EOS is
  committed (``stop_at_eos=False`` decodes the whole budget);
* it decodes the last block whole; dllm leaves the slots past ``max_new_tokens`` masked (the model
  sees them as masks), so an answer never depends on tokens it does not return (the outputs agree
  when the prompt and the budget end on a block boundary, as the reference's canvas always does).
"""

from __future__ import annotations

import torch

from dllm.decoding.loops.block_grid import choose, first_block_starts, join_at_boundary, windows
from dllm.decoding.policies import quota_schedule, select_top_k
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.state import DecodeState


def sdar_transfer(conf: torch.Tensor, candidates: torch.Tensor, quota: torch.Tensor, unmasking: str,
                  threshold: float) -> torch.Tensor:
    """SDAR's commit set for one step: [batch, n] bool (see the module docstring)."""
    if unmasking == "low_confidence_dynamic":
        high = candidates & (conf > threshold)
        enough = high.sum(-1) >= quota
        return torch.where(enough[:, None], high, select_top_k(conf, candidates, quota))
    return select_top_k(conf, candidates, quota)


def decode_sdar(model, state: DecodeState, gen: torch.Generator | None):
    cfg = state.cfg
    B, P = cfg.block_size, state.P
    steps = cfg.denoising_steps or B
    quota = quota_schedule(torch.tensor([B]), steps)[0].to(state.x.device)  # [steps]
    runner = ModelRunner(model, prompt_length=P, key_valid=state.key_valid,
                         rules=LogitRules.from_config(cfg, state.mask_id, state.eos))
    # prompt_length=None: the model's block grid starts at each row's first token (position 0)
    cache = model.allocate_cache(state.key_valid, prompt_length=None)
    cur = first_block_starts(state.key_valid, P, B)  # per row: the start of the block being decoded
    width = state.x.shape[1]
    budget = torch.full_like(cur, P + state.limit)  # slots past max_new_tokens in the last block stay masks
    cached_end = 0
    first = True
    while True:
        if state.joining and not first:  # a block boundary: done rows leave, waiting rows join
            cur, budget, cache, cached_end = join_at_boundary(state, runner, cache, cached_end, cur + B, budget)
            width = state.x.shape[1]
        elif not first:
            cur = cur + B
        first = False
        if not state.live:
            break
        lo, top = torch.stack(torch.aminmax(cur)).tolist()  # one host read per block
        hi = min(width, top + B)
        if lo >= hi:
            break
        window = windows(cur, 0, B, lo, hi) & (torch.arange(lo, hi, device=state.x.device)[None, :] < budget[:, None])
        step = torch.zeros(state.live, dtype=torch.long, device=state.x.device)
        while state.live:
            candidates = state.masked(lo, hi) & window
            need = candidates.any(-1)
            if not bool(need.any()):
                break
            logits = runner.cached(state.x, start=cached_end, end=hi, cache=cache, mode="prefix", block_size=B)
            logits = logits[:, lo - cached_end:]
            cached_end = lo  # everything before this block is final: its K/V from this forward are exact
            state.count_forward(need)
            x0, conf = choose(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, generator=gen)
            transfer = sdar_transfer(conf, candidates, quota[step.clamp(max=steps - 1)], cfg.unmasking,
                                     cfg.threshold)
            state.commit(lo, transfer & need[:, None], x0)
            step += need.long()
            keep = state.pop_finished()
            if keep is not None:
                cur, budget, window, step = cur[keep], budget[keep], window[keep], step[keep]
                runner.select_rows(keep)
                cache = cache.select_rows(keep)
            if state.joining:  # rows join once this block ends
                state.join_ready = not bool((state.masked(lo, hi) & window).any())
            yield
    return {"forward_seconds": runner.forward_seconds, "forwards": runner.forwards}

