"""Semi-autoregressive block decoding for bidirectional models (LLaDA, Fast-dLLM, Dream algorithms).

Blocks of ``block_length`` are decoded left to right; inside a block every step runs one forward,
chosen by the call's cache plan (:mod:`dllm.decoding.cache_plans`: none, prefix, dual, exact block cache,
guidance), and the strategy's commit policy (:mod:`dllm.decoding.commit`: quota, threshold, factor, Dream
schedules) picks the masked positions to fill. The loop yields after every forward.

Rows may join at block boundaries (``DecodeSession.add_rows``; see ``dllm.decoding.joining``): a new
row's prompt ends at the current block start, and rows leave once their own ``num_blocks`` blocks
are done, so the loop runs until no row is left and none is waiting. Where both the policy and the
plan allow it (``joins_mid_block``: threshold and factor with any cache but guidance, the dual cache without
``dual_cache_step_bound``) rows also join after any step, the current block being their first; such a
row counts its own steps in the block (its refreshes, with the prefix and dual caches).

Loop bounds follow the references: ``vanilla`` and the Dream algorithms without a cache run
exactly ``steps/num_blocks`` forwards per block (LLaDA, Dream: no early exit); cached and threshold/factor variants check
"block done" before each forward (Fast-dLLM upstream); ``dual_cache_step_bound`` caps the dual cache's
steps per block as upstream does (:class:`dllm.decoding.cache_plans.DualCache`).
"""

from __future__ import annotations

import torch

from dllm.decoding.cache_plans import plan_for
from dllm.decoding.joining import poll
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.state import DecodeState


def decode_semi_ar(model, state: DecodeState, gen: torch.Generator | None):
    cfg = state.cfg
    B = cfg.block_size
    runner = ModelRunner(model, prompt_length=state.P, key_valid=state.key_valid,
                         rules=LogitRules.from_config(cfg, state.mask_id, state.eos))
    plan = plan_for(model, cfg)(model, cfg, state, runner)
    policy = state.strategy.policy(cfg, state)
    spb = cfg.steps_per_block()
    fixed_steps = policy.fixed_steps and cfg.cache == "none"
    mid_block = state.joining and policy.joins_mid_block and plan.joins_mid_block and not fixed_steps

    since = None  # rows that joined inside the current block: the block step each joined at (else None)

    def keep_rows(keep):
        nonlocal since
        if keep is not None:
            policy.keep_rows(keep)
            runner.select_rows(keep)
            plan.keep_rows(keep)
            since = since[keep] if since is not None else None

    blk, s = 0, state.P
    while True:
        if state.joining:  # rows whose generated region is done leave; waiting rows join at the block start
            if state.live:
                ended = state.row_spans()[1] <= s
                if bool(ended.any()):
                    keep_rows(state.retire(ended, reason="length"))
            joined, shift, plan.cache = poll(state, place_at=s, runner=runner, cache=plan.cache)
            if joined:
                s -= shift
                plan.joined(shift, int(state.row_spans()[0][-joined:].min()))
        elif blk >= cfg.num_blocks:
            break
        if state.live == 0:
            break
        e = s + B
        blk += 1
        policy.start_block(state.masked(s, e).sum(-1))
        i, since = 0, None
        while state.live:
            need = state.masked(s, e).any(-1)
            if (i >= spb) if fixed_steps else not bool(need.any()):
                break
            if plan.block_over(i):
                break
            lo = plan.first_slot(state, s, i)
            logits = plan.forward(state, lo, s, e, i if since is None else i - since)  # each row's own step
            state.count_forward(None if fixed_steps else need)
            x0, conf = policy.choose(logits, gen)
            transfer = policy.select(conf, state.masked(lo, e), i, gen)
            state.commit(lo, transfer & need[:, None], x0)
            i += 1
            keep_rows(state.pop_finished())
            if state.joining and not mid_block:  # rows join once this block ends
                state.join_ready = ((i >= spb) if fixed_steps else not bool(state.masked(s, e).any())) \
                    or plan.block_over(i)
            yield
            if mid_block and state.live and state.incoming:  # rows join now, their first block this one
                joined, shift, plan.cache = poll(state, place_at=s, runner=runner, cache=plan.cache)
                if joined:
                    s, e = s - shift, e - shift
                    plan.joined(shift, int(state.row_spans()[0][-joined:].min()))
                    old = torch.zeros(state.live - joined, dtype=torch.long, device=state.x.device)
                    since = torch.cat([old if since is None else since,
                                       torch.full((joined,), i, dtype=torch.long, device=state.x.device)])
        s = e
    return {"forward_seconds": runner.forward_seconds, "forwards": runner.forwards}
