"""Semi-autoregressive block decoding for bidirectional models (LLaDA, Fast-dLLM, Dream algorithms).

Blocks of ``block_length`` are decoded left to right; inside a block every step runs one forward
and a commit policy picks the masked positions to fill. The cache policy decides what each step
recomputes:

* ``none``: the whole canvas every step (LLaDA ``generate.py``; Fast-dLLM ``generate``).
* ``prefix``: a full forward at block start (doubling as step 0) whose K/V are kept for the prefix
  only; later steps feed the block **and the whole suffix** against that frozen prefix.
* ``dual``: the same refresh keeps the whole canvas' K/V; later steps feed only the block, whose
  fresh K/V replace the stale ones in place.
``refresh_interval`` additionally recomputes everything every N steps inside a block.

Rows may join at block boundaries (``BatchStreamer.admit_rows``; see ``dllm.decoding.joining``): a new
row's prompt ends at the current block start, and rows leave once their own ``num_blocks`` blocks
are done, so the loop runs until no row is left.

Loop bounds follow the references: ``vanilla`` and the Dream algorithms without a cache run
exactly ``steps/num_blocks`` forwards per block (LLaDA, Dream: no early exit); cached and threshold/factor variants check
"block done" before each forward (Fast-dLLM upstream). ``dual_cache_step_bound`` reproduces the
upstream dual-cache loop cap ``range(1, steps_per_block)`` and, with it, upstream's block-start
refresh filling masks that earlier blocks left behind (:func:`_sweep_start`).
"""

from __future__ import annotations

import torch

from dllm.decoding.joining import joining_enabled, poll
from dllm.decoding.policies import (
    quota_schedule,
    select_factor,
    select_threshold,
    select_top_k,
)
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.sampling import dream_choice, llada_choice
from dllm.decoding.state import DecodeState

DREAM_ALGS = {"entropy": "entropy", "margin": "margin", "maskgit_plus": "maskgit_plus"}


def _choose(strategy: str, logits: torch.Tensor, cfg, gen) -> tuple[torch.Tensor, torch.Tensor]:
    if strategy in DREAM_ALGS:
        return dream_choice(logits, alg=DREAM_ALGS[strategy], temperature=cfg.temperature, top_p=cfg.top_p,
                            top_k=cfg.top_k, generator=gen)
    return llada_choice(logits, temperature=cfg.temperature, remasking=cfg.remasking, generator=gen,
                        top_p=cfg.top_p, top_k=cfg.top_k)


def _cfg_logits(runner: ModelRunner, state: DecodeState, prompt_slots: torch.Tensor, start: int, end: int,
                scale: float) -> torch.Tensor:
    """Classifier-free guidance: un-prompted canvas = prompt slots masked; one batched forward."""
    un = state.x.clone()
    un[:, : state.P][prompt_slots] = state.mask_id
    both = torch.cat([state.x, un], 0)
    kv = runner.key_valid
    runner.key_valid = torch.cat([kv, kv], 0)
    logits = runner.full(both, logits_from=start)[:, : end - start]
    runner.key_valid = kv
    cond, uncond = logits.chunk(2, 0)
    return uncond + (scale + 1.0) * (cond - uncond)


def decode_semi_ar(model, state: DecodeState, gen: torch.Generator | None) -> dict:
    cfg = state.cfg
    strategy = cfg.strategy
    B, P = cfg.block_size, state.P
    T = P + state.G
    spb = cfg.steps_per_block()
    runner = ModelRunner(model, prompt_length=P, key_valid=state.key_valid,
                         rules=LogitRules.from_config(cfg, state.mask_id, state.eos_id))
    cache = None
    if cfg.cache != "none":
        cache = model.allocate_cache(state.key_valid, prompt_length=P)
    # Block-causal models: finished blocks are cached exactly (their K/V depend only on the prefix)
    # and a step feeds only the current block; the decoding block is the mask's block.
    exact = model.is_block_causal and cfg.cache == "none" and cfg.cfg_scale == 0
    mask_kw = {"block_size": B} if model.is_block_causal else {}
    if exact:
        cache = model.allocate_cache(state.key_valid, prompt_length=P)
    cached_end = 0
    prompt_slots = ((state.x[:, :P] != state.mask_id) & state.key_valid[:, :P]) if cfg.cfg_scale > 0 else None
    # The references run a fixed number of forwards per block (no early exit) without a cache.
    fixed_steps = strategy in ("vanilla", *DREAM_ALGS) and cfg.cache == "none"

    # Continuous batching (decoding.joining): at each block boundary rows whose generated region is
    # done leave, and new rows join with their prompts ending at the block start.
    join = joining_enabled(state.batch_streamer, model, cfg)
    blk, s = 0, P
    while True:
        if join:
            if state.live:
                ended = state.row_spans()[1] <= s
                if bool(ended.any()):
                    keep = state.retire(ended, reason="length")
                    runner.select_rows(keep)
                    if cache is not None:
                        cache = cache.select_rows(keep)
            joined, shift, cache = poll(state, place_at=s, runner=runner, cache=cache)
            if joined:
                s -= shift
                first_new = int(state.row_spans()[0][-joined:].min())
                cached_end = min(max(0, cached_end - shift), first_new)  # exact cache: feed the new prompts
                T = state.x.shape[1]
        elif blk >= cfg.num_blocks:
            break
        if state.live == 0:
            break
        e = s + B
        blk += 1
        s_next = e
        quota = quota_schedule(state.masked(s, e).sum(-1), spb)
        i = 0
        while state.live:
            need = state.masked(s, e).any(-1)
            if fixed_steps:
                if i >= spb:
                    break
            elif not bool(need.any()):
                break
            if cfg.cache == "dual" and cfg.dual_cache_step_bound and i >= spb:
                break
            refresh = cache is None or i == 0 or (cfg.refresh_interval and i % cfg.refresh_interval == 0)
            # The first slot this step may fill: the block start, except at an upstream dual-cache refresh
            lo = _sweep_start(state) if (cfg.cache == "dual" and cfg.dual_cache_step_bound and i == 0) else s
            if cfg.cfg_scale > 0:
                logits = _cfg_logits(runner, state, prompt_slots, s, e, cfg.cfg_scale)
            elif exact:
                logits = runner.cached(state.x, start=cached_end, end=e, cache=cache, mode="prefix", **mask_kw)
                logits = logits[:, s - cached_end:]
                cached_end = s  # everything before the block is final: its K/V from this forward are exact
            elif cache is None:
                logits = runner.full(state.x, logits_from=s, **mask_kw)[:, :B]
            elif refresh:
                logits = runner.full(state.x, logits_from=lo, cache=cache, **mask_kw)[:, : e - lo]
                if cfg.cache == "prefix":
                    cache.length = s  # keep the prefix only; the suffix is recomputed every step
            elif cfg.cache == "prefix":
                logits = runner.cached(state.x, start=s, end=T, cache=cache, mode="prefix", logits_end=e, **mask_kw)
            else:
                logits = runner.cached(state.x, start=s, end=e, cache=cache, mode="replace", **mask_kw)
            state.count_forward(None if fixed_steps else need)
            candidates = state.masked(lo, e)
            x0, conf = _choose(strategy, logits, cfg, gen)
            if strategy == "threshold":
                transfer = select_threshold(conf, candidates, cfg.threshold)
            elif strategy == "factor":
                transfer = select_factor(conf, candidates, cfg.factor)
            elif strategy in DREAM_ALGS:
                transfer = _dream_transfer(conf, candidates, i, spb, cfg, gen)
            else:  # vanilla quota
                k = quota[:, i] if i < spb else candidates.sum(-1)
                transfer = select_top_k(conf, candidates, k)
            state.commit(lo, transfer & need[:, None], x0)
            i += 1
            keep = state.pop_finished()
            if keep is not None:
                quota = quota[keep]
                if prompt_slots is not None:
                    prompt_slots = prompt_slots[keep]
                runner.select_rows(keep)
                if cache is not None:
                    cache = cache.select_rows(keep)
        s = s_next
    return {"forward_seconds": runner.forward_seconds, "forwards": runner.forwards}


def _sweep_start(state: DecodeState) -> int:
    """First generated slot of any row: where upstream's block-start refresh looks for masks.

    With ``dual_cache_step_bound`` (``range(1, steps_per_block)``) a block can end with masks left;
    upstream Fast-dLLM's next refresh forward takes every masked slot before the block end as a
    candidate (``mask_index = x == mask_id; mask_index[:, e:] = False``), so such masks can be
    filled there, the refresh's at-least-one token included. Slots before a row's generated region
    hold its prompt or padding, never a mask.
    """
    return state.P if state.gstart is None else int(state.gstart.min())


def _dream_transfer(conf, candidates, i, steps, cfg, gen) -> torch.Tensor:
    """Dream's schedule: at step i of ``steps`` commit int(n * (1 - s/t)) tokens, everything at the end.

    ``timesteps = linspace(1, eps, steps + 1)``; t, s = ts[i], ts[i+1]. n is counted per row (the
    reference averages it over the batch, which breaks batch invariance). With ``alg_temp`` > 0
    positions are sampled from softmax(conf / alg_temp) instead of taken top-k.
    """
    n = candidates.sum(-1)
    if i >= steps - 1:
        k = n
    else:
        ts = torch.linspace(1, cfg.eps, steps + 1)
        t, s = float(ts[i]), float(ts[i + 1])
        k = (n.double() * (1 - s / t)).long()
    if cfg.alg_temp:
        out = torch.zeros_like(candidates)
        c = torch.where(candidates, conf.double() / cfg.alg_temp, torch.full_like(conf, float("-inf"), dtype=torch.float64))
        for r in range(conf.shape[0]):
            if int(k[r]) > 0:
                idx = torch.multinomial(torch.softmax(c[r], -1), int(k[r]), generator=gen)
                out[r, idx] = True
        return out & candidates
    return select_top_k(conf, candidates, k)
