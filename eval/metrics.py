"""Speed/quality metrics: tokens per forward (TPF), AUP (d3LLM), latency percentiles, accuracy.

TPF definition used everywhere in this project: the number of committed generated tokens up to
and including the first EOS (EOS/padding fill after the first EOS is not counted) divided by the
number of model forward passes (a LoPA round -- all branches evaluated together -- counts as one).
Over a dataset, TPF is the ratio of sums (total tokens / total forwards), as d3LLM reports it.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

DEFAULT_AUP_ALPHA = 3.0
AUP_MAX_DROP = 5.0  # accuracy points a faster setting may lose relative to the slowest one


def count_generated_tokens(token_ids: Any, eos_id: int, pad_id: int | None = None) -> int:
    """Generated tokens up to and including the first ``eos_id``.

    ``token_ids`` is a list or a 1-D tensor/array of ints. Without an EOS, counting stops before
    the first ``pad_id`` (if given), else every token counts.
    """
    ids = token_ids.tolist() if hasattr(token_ids, "tolist") else list(token_ids)
    if ids and isinstance(ids[0], list):
        raise ValueError("count_generated_tokens expects a 1-D sequence of token ids")
    for i, t in enumerate(ids):
        if t == eos_id:
            return i + 1
        if pad_id is not None and t == pad_id:
            return i
    return len(ids)


def _total(x: Any) -> float:
    """A scalar (int, numpy/torch 0-d) as is; a sequence/1-D array summed."""
    if isinstance(x, numbers.Real) or getattr(x, "ndim", None) == 0:
        return float(x)
    return float(sum(x))


def tpf(generated_tokens: int | Iterable[int], forwards: int | Iterable[int]) -> float:
    """Tokens per forward. Sequences (one entry per sample) are summed first: sum(tokens)/sum(forwards)."""
    tokens, nfe = _total(generated_tokens), _total(forwards)
    if nfe <= 0:
        raise ValueError(f"forwards must be positive, got {nfe}")
    if tokens < 0:
        raise ValueError(f"generated_tokens must be non-negative, got {tokens}")
    return tokens / nfe


def aup_weight(y: float, y_max: float, alpha: float = DEFAULT_AUP_ALPHA) -> float:
    """d3LLM accuracy weight ``W(y) = min(1, exp(-alpha * (1 - y / y_max)))``."""
    return min(1.0, math.exp(-alpha * (1.0 - y / y_max)))


def aup(
    points: Iterable[tuple[float, float]],
    y_max: float | None = None,
    alpha: float = DEFAULT_AUP_ALPHA,
    strict: bool = True,
) -> float:
    """Area Under the Parallelism curve, as d3LLM defines it.

    ``points`` are (TPF, accuracy in %) pairs, sorted here by TPF. ``y_max`` is the best accuracy
    over all methods in the task pool (AUP values are only comparable with a shared ``y_max``);
    it defaults to the best accuracy among ``points``. With (rho_i, y_i) sorted by rho:

        AUP = rho_1 * y_1 + sum_{i>=2} (rho_i - rho_{i-1}) * (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2

    (first rectangle unweighted). Points with y_i < y_1 - 5 are dropped; the fastest point must
    satisfy y_1 - y_last <= 5, otherwise ValueError (``strict=False`` drops such points instead).
    A single point gives rho_1 * y_1 (an AR model at TPF 1 scores its accuracy).
    """
    pts = sorted((float(r), float(y)) for r, y in points)
    if not pts:
        raise ValueError("aup needs at least one (tpf, accuracy) point")
    if pts[0][0] <= 0:
        raise ValueError(f"TPF values must be positive, got {pts[0][0]}")
    y_first = pts[0][1]
    if strict and y_first - pts[-1][1] > AUP_MAX_DROP:
        raise ValueError(
            f"accuracy drops by {y_first - pts[-1][1]:.2f} > {AUP_MAX_DROP} points from the slowest "
            "to the fastest setting; AUP is undefined (pass strict=False to drop such points)"
        )
    pts = [p for p in pts if p[1] >= y_first - AUP_MAX_DROP]
    ymax = max(y for _, y in pts) if y_max is None else float(y_max)
    if ymax <= 0:
        raise ValueError(f"y_max must be positive, got {ymax}")
    area = pts[0][0] * pts[0][1]
    for (r0, y0), (r1, y1) in zip(pts, pts[1:]):
        area += 0.5 * (r1 - r0) * (y1 * aup_weight(y1, ymax, alpha) + y0 * aup_weight(y0, ymax, alpha))
    return area


def percentile(values: Sequence[float], q: float) -> float:
    """``q``-th percentile (0-100) with linear interpolation between closest ranks:
    rank = q/100 * (n - 1) on the sorted values (numpy's default "linear" method)."""
    if not values:
        raise ValueError("percentile of an empty list")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    rank = q / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def latency_percentiles(seconds: Sequence[float]) -> dict[str, float]:
    """``{"p50": ..., "p95": ...}`` of per-request latencies (linear interpolation, see ``percentile``)."""
    return {"p50": percentile(seconds, 50), "p95": percentile(seconds, 95)}


def accuracy(scores: Iterable[Any]) -> float:
    """Fraction correct; items are ``Score`` objects (``.correct``) or bools. ValueError if empty."""
    flags = [bool(getattr(s, "correct", s)) for s in scores]
    if not flags:
        raise ValueError("accuracy of an empty list of scores")
    return sum(flags) / len(flags)
