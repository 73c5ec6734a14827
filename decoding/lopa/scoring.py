"""LoPA's pure pieces: branch scores, winner selection, lookahead positions and the winners' rankings.

Conventions (branch ids, tie-breaks, the score formula) are documented in :mod:`dllm.decoding.lopa`.
"""

from __future__ import annotations

import torch

from dllm.decoding.errors import GenerationConfigError

NEG_INF = float("-inf")


def branch_scores(conf: torch.Tensor, score_mask: torch.Tensor, creation: torch.Tensor, alpha: float,
                  rho: float, certain: float = 1.0) -> torch.Tensor:
    """Score of each branch [n] from its per-position confidences [n, W] and scored positions [n, W].

    ``alpha * creation + (1 - alpha) * mean(lowest max(1, floor(rho * m)) confidences)``. ``m``
    is the number of scored positions, and the mean is ``certain`` (the confidence of a sure
    position: 1.0 for probabilities, 0.0 for negative entropy) when ``m = 0``.
    """
    c = conf.double()
    m = score_mask.sum(-1)
    if rho >= 1.0:
        total = torch.where(score_mask, c, torch.zeros_like(c)).sum(-1)
        cnt = m
    else:
        srt = torch.where(score_mask, c, torch.full_like(c, float("inf"))).sort(-1).values
        cnt = torch.floor(m.double() * rho).long().clamp(min=1)
        cnt = torch.where(m == 0, torch.zeros_like(cnt), cnt)
        take = torch.arange(c.shape[-1], device=c.device)[None] < cnt[:, None]
        total = torch.where(take, srt, torch.zeros_like(srt)).sum(-1)
    future = torch.where(m > 0, total / cnt.clamp(min=1).double(), torch.full_like(total, certain))
    return alpha * creation.to(future) + (1.0 - alpha) * future


def select_winners(score: torch.Tensor, rows: int, groups: int, force_anchor: bool = False) -> torch.Tensor:
    """Winning branch id per row from branch-major scores [groups * rows].

    Ranking order ``1, .., k, 0``, first maximum wins (ties: lowest lookahead id, then anchor).
    """
    if force_anchor or groups == 1:
        return torch.zeros(rows, dtype=torch.long)
    s = score.detach().double().cpu().view(groups, rows)
    order = torch.tensor(list(range(1, groups)) + [0])
    s = s[order]
    best = s.max(0).values
    rank = torch.arange(groups)[:, None].expand_as(s)
    first = torch.where(s == best[None], rank, torch.full_like(rank, groups)).min(0).values
    return order[first]


def top_lookaheads(conf: torch.Tensor, tokens: torch.Tensor, candidates: torch.Tensor, k: int) -> list[list[tuple[int, int, float]]]:
    """Per row, up to k (offset, token, confidence) at the most confident candidate offsets.

    Ties go to the lower offset.
    """
    if k <= 0:
        return [[] for _ in range(conf.shape[0])]
    c = torch.where(candidates, conf.double(), torch.full_like(conf, NEG_INF, dtype=torch.float64))
    order = torch.sort(c, dim=-1, descending=True, stable=True).indices[:, :k]
    # one host copy of (offset, candidate?, token, confidence) at the k best offsets; float64 holds every
    # offset and token id exactly
    picked = torch.stack([order.double(), candidates.gather(1, order).double(), tokens.gather(1, order).double(),
                          conf.double().gather(1, order)], -1).cpu().tolist()
    out = []
    for row_picks in picked:
        row = []
        for i, is_cand, tok, cf in row_picks:
            if not is_cand:
                break
            row.append((int(i), int(tok), cf))
        out.append(row)
    return out


def certain_confidence(kind: str) -> float:
    """The confidence of a position that is sure: max probability 1, or negative entropy 0."""
    return 0.0 if kind == "neg_entropy" else 1.0

def gather_rows(t: torch.Tensor, winners: torch.Tensor, rows: int) -> torch.Tensor:
    idx = winners.to(t.device) * rows + torch.arange(rows, device=t.device)
    return t.index_select(0, idx)


def winner_rankings(res, cfg, winners: torch.Tensor, rows: int, conf: torch.Tensor, device, fill_kind: str):
    """From a round's :class:`~dllm.decoding.lopa.slots.RoundResult`: the winners' lookahead ranking and anchor-fill ranking [rows, W] (``conf`` where it is the probability).

    An executor that does not return a ranking the config asks for fails here rather than rank by
    probability without saying so.
    """
    def pick(t):
        return gather_rows(t, winners, rows).to(device)

    if cfg.lopa_confidence != "prob" and res.rank is None:
        raise GenerationConfigError(f"this LoPA executor returns no lopa_confidence={cfg.lopa_confidence!r} ranking")
    rank = conf if res.rank is None else pick(res.rank)
    if fill_kind == "prob":
        return rank, conf
    if fill_kind == cfg.lopa_confidence:
        return rank, rank
    if res.fill is None:
        raise GenerationConfigError(f"this LoPA executor returns no d2f_confidence={fill_kind!r} ranking; "
                                    "use d2f_confidence='prob' or equal to lopa_confidence")
    return rank, pick(res.fill)
