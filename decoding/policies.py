"""Commit policies: (confidence, candidate positions) -> positions to commit. Pure and batched.

``conf`` is [batch, n] (higher = more certain); ``candidates`` is a bool [batch, n] marking the
masked positions a step may fill. Every function returns a bool [batch, n] commit set that is a
subset of ``candidates``.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def quota_schedule(num_masked: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's per-step token quota [batch, steps]: n // s each, the first n % s steps one more.

    Uniform because the forward process is linear in t: the expected number of tokens unmasked
    per uniform time step is constant.
    """
    base = num_masked // steps
    rem = num_masked % steps
    sched = base[:, None].repeat(1, steps)
    sched += (torch.arange(steps, device=num_masked.device)[None, :] < rem[:, None]).long()
    return sched


def _masked_conf(conf: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    return torch.where(candidates, conf.double(), torch.full_like(conf, NEG_INF, dtype=torch.float64))


def select_top_k(conf: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row, the ``k[row]`` most confident candidates (ties: lowest index first, like torch.topk)."""
    c = _masked_conf(conf, candidates)
    order = torch.sort(c, dim=-1, descending=True, stable=True).indices
    ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(c.shape[-1], device=c.device).expand_as(order))
    k = torch.minimum(k.to(c.device), candidates.sum(-1))
    return (ranks < k[:, None]) & candidates


def select_threshold(conf: torch.Tensor, candidates: torch.Tensor, tau: float) -> torch.Tensor:
    """Fast-dLLM: every candidate with conf >= tau, plus each row's most confident one (progress)."""
    take = candidates & (conf >= tau)
    best = select_top_k(conf, candidates, torch.ones(conf.shape[0], dtype=torch.long, device=conf.device))
    return take | best


def select_factor(conf: torch.Tensor, candidates: torch.Tensor, factor: float) -> torch.Tensor:
    """Fast-dLLM's factor rule (Theorem 1), with the reference's off-by-one kept.

    Sort a row's n candidate confidences c_1 >= c_2 >= ...; the k-th (1-based) needs
    c_k >= 1 - f/(k+1), except k = 1 which is always accepted. Scan upward and stop at the first
    failure at index i (0-based) -> accept i tokens; if the scan never fails *or fails at the last
    index*, all n are accepted (reference quirk).
    """
    c = _masked_conf(conf, candidates)
    n = candidates.sum(-1)
    sorted_c = torch.sort(c, dim=-1, descending=True, stable=True).values
    idx = torch.arange(c.shape[-1], device=c.device)
    need = 1.0 - factor / (idx + 2).double()
    need[0] = -1.0
    fails = (sorted_c < need[None, :]) & (idx[None, :] < n[:, None])
    first_fail = torch.where(fails.any(-1), fails.double().argmax(-1), n - 1)
    accept = torch.where((first_fail == n - 1) | (first_fail == 0), first_fail + 1, first_fail)
    accept = torch.where(n == 0, torch.zeros_like(accept), accept)
    return select_top_k(conf, candidates, accept)


def select_above(conf: torch.Tensor, candidates: torch.Tensor, tau: float, *, strict: bool = True) -> torch.Tensor:
    """D2F: candidates with conf > tau (strict, as the reference); may be empty."""
    return candidates & ((conf > tau) if strict else (conf >= tau))


def select_best(conf: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    return select_top_k(conf, candidates, torch.ones(conf.shape[0], dtype=torch.long, device=conf.device))
