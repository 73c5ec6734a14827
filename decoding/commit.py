"""Commit policies of the semi-AR loop: from a step's logits, which masked slots of the block to fill.

A policy is built once per call (``Strategy.policy(cfg, state)``) and the loop applies it without naming
it: :meth:`CommitPolicy.choose` turns logits into a token and a confidence per slot,
:meth:`CommitPolicy.start_block` sees the block's masked counts, :meth:`CommitPolicy.select` picks the
slots to commit at step ``i`` of the block. The selection rules themselves are the pure functions of
:mod:`dllm.decoding.policies`.
"""

from __future__ import annotations

import torch

from .policies import quota_schedule, select_factor, select_threshold, select_top_k
from .sampling import dream_choice, llada_choice


class CommitPolicy:
    #: The reference runs exactly ``steps_per_block`` forwards per block without a cache, even when the
    #: block fills up early (LLaDA's and Dream's loops); with a cache the block ends when it is full.
    fixed_steps = False
    #: Its choice depends only on the step's logits (no per-block schedule), so a row may join in the
    #: middle of a block and decode as it does alone.
    joins_mid_block = False

    def __init__(self, cfg, state) -> None:
        self.cfg = cfg
        self.state = state
        self.steps = cfg.steps_per_block()

    def choose(self, logits: torch.Tensor, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        return llada_choice(logits, temperature=self.state.temperature(), remasking=cfg.remasking, generator=gen,
                            top_p=cfg.top_p, top_k=cfg.top_k)

    def start_block(self, masked: torch.Tensor) -> None:
        """``masked`` [live]: masked slots in each row's new block."""

    def select(self, conf: torch.Tensor, candidates: torch.Tensor, step: int, gen) -> torch.Tensor:
        raise NotImplementedError

    def keep_rows(self, keep: torch.Tensor) -> None:
        """Rows left the batch: ``keep`` are the local indices of those that stay."""


class Quota(CommitPolicy):
    """LLaDA: the ``k`` most confident masked slots, ``k`` from the block's uniform quota schedule."""

    fixed_steps = True

    def start_block(self, masked: torch.Tensor) -> None:
        self.quota = quota_schedule(masked, self.steps)

    def select(self, conf, candidates, step, gen):
        k = self.quota[:, step] if step < self.steps else candidates.sum(-1)
        return select_top_k(conf, candidates, k)

    def keep_rows(self, keep):
        self.quota = self.quota[keep]


class Threshold(CommitPolicy):
    """Fast-dLLM: every masked slot with confidence >= ``threshold`` (per row), plus the most confident one."""

    joins_mid_block = True

    def select(self, conf, candidates, step, gen):
        tau = self.state.option("threshold")
        return select_threshold(conf, candidates, tau.to(conf.dtype) if torch.is_tensor(tau) else tau)


class Factor(CommitPolicy):
    """Fast-dLLM's factor rule (:func:`dllm.decoding.policies.select_factor`)."""

    joins_mid_block = True

    def select(self, conf, candidates, step, gen):
        return select_factor(conf, candidates, self.cfg.factor)


class DreamSchedule(CommitPolicy):
    """Dream's timestep schedule, positions ranked by ``alg`` (see :func:`dream_transfer`)."""

    fixed_steps = True
    alg = "maskgit_plus"

    def choose(self, logits, gen):
        cfg = self.cfg
        return dream_choice(logits, alg=self.alg, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                            generator=gen)

    def select(self, conf, candidates, step, gen):
        return dream_transfer(conf, candidates, step, self.steps, self.cfg, gen)


class Entropy(DreamSchedule):
    alg = "entropy"


class Margin(DreamSchedule):
    alg = "margin"


class MaskGitPlus(DreamSchedule):
    alg = "maskgit_plus"


def dream_transfer(conf, candidates, i, steps, cfg, gen) -> torch.Tensor:
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
