"""Token choice and per-position statistics from logits: pure tensor functions.

All functions take logits of the positions under consideration only ([..., V]) so callers never
pay for a softmax over positions they will not commit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import RANKINGS
from .kernels import confidence as kernels
from .kernels.confidence import GREEDY_BELOW


def _fused(logits: torch.Tensor, top_p: float | None = None, top_k: int | None = None):
    """The fused Triton statistics (dllm.decoding.kernels.confidence) when they apply: on CUDA (see
    ``use_triton_kernels``) and with no top-p/top-k filter. None means: use the PyTorch code below,
    which stays the reference and the CPU path (the kernel module imports triton only on first use)."""
    if top_k is not None or (top_p is not None and top_p < 1.0) or logits.dim() == 0:
        return None
    return kernels.confidence_stats_triton if kernels.use_triton_kernels(logits.device) else None


def row_column(temperature: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-row values ([rows] or [rows, 1]) shaped to broadcast over ``like`` [rows, ...] (float64)."""
    return temperature.to(torch.float64).reshape(-1, *([1] * (like.dim() - 1)))


def gumbel_argmax(logits: torch.Tensor, temperature: float | torch.Tensor,
                  generator: torch.Generator | None) -> torch.Tensor:
    """LLaDA's float64 Gumbel-max: argmax(exp(l) / (-log U)^T) is an exact sample of softmax(l / T).

    float64 on purpose: low-precision Gumbel noise measurably hurts masked-diffusion sampling
    (arXiv:2409.02908). At temperature 0 this is a plain argmax. ``temperature`` may be one value per
    row (a tensor): rows at 0 then take the plain argmax of the float64 logits (the same token).
    """
    if torch.is_tensor(temperature):
        t = row_column(temperature, logits)
        l64 = logits.double()
        u = torch.rand(l64.shape, dtype=torch.float64, device=l64.device, generator=generator)
        return torch.where(t >= GREEDY_BELOW, l64 - t * torch.log(-torch.log(u)), l64).argmax(-1)
    if temperature < GREEDY_BELOW:
        return logits.argmax(-1)
    l64 = logits.double()
    u = torch.rand(l64.shape, dtype=torch.float64, device=l64.device, generator=generator)
    # exp(l)/(-log u)^T is computed in log space: l - T*log(-log u), same argmax, no overflow.
    return (l64 - temperature * torch.log(-torch.log(u))).argmax(-1)


def filter_top_p_top_k(logits: torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Dream's order: nucleus first, then top-k; filtered entries become -inf."""
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum > top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        mask = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, sorted_idx, remove)
        logits = logits.masked_fill(mask, float("-inf"))
    if top_k is not None:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def llada_choice(
    logits: torch.Tensor,
    *,
    temperature: float | torch.Tensor,
    remasking: str,
    generator: torch.Generator | None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, confidence) as LLaDA / Fast-dLLM choose them.

    The token is a Gumbel-max sample (argmax at T=0); its confidence is its probability under the
    noise-free float64 softmax (``low_confidence``) or U(0,1) (``random``). ``temperature`` may be one
    value per row (a [rows, 1] tensor: ``DecodeState.temperature``).
    """
    if (remasking in ("low_confidence", "random") and not torch.is_tensor(temperature)
            and (kernel := _fused(logits, top_p, top_k)) is not None):
        # Same randomness as gumbel_argmax: the same torch.rand draw, consumed by the kernel.
        noise = None
        if temperature >= GREEDY_BELOW:
            noise = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
        st = kernel(logits, temperature=temperature, noise=noise, precision="fp64",
                    need=("max_prob",) if remasking == "low_confidence" else ())
        x0 = st.token if noise is None else st.sample
        if remasking == "low_confidence":
            return x0, (st.max_prob if noise is None else st.sample_prob)
        return x0, torch.rand(x0.shape, dtype=torch.float64, device=x0.device, generator=generator)
    if top_p is not None or top_k is not None:
        logits = filter_top_p_top_k(logits, top_p, top_k)
    x0 = gumbel_argmax(logits, temperature, generator)
    if remasking == "low_confidence":
        p = F.softmax(logits.double(), dim=-1)
        conf = torch.gather(p, -1, x0[..., None]).squeeze(-1)
    elif remasking == "random":
        conf = torch.rand(x0.shape, dtype=torch.float64, device=x0.device, generator=generator)
    else:
        raise ValueError(f"remasking={remasking!r}; valid: low_confidence, random")
    return x0, conf


def llada_token(
    logits: torch.Tensor,
    *,
    temperature: float,
    generator: torch.Generator | None,
    top_p: float | None = None,
    top_k: int | None = None,
) -> torch.Tensor:
    """The token of :func:`llada_choice` alone (same random draw), for rules that never read its
    confidence (d3LLM's entropy rule): skips the float64 softmax over the vocabulary."""
    if top_p is not None or top_k is not None:
        logits = filter_top_p_top_k(logits, top_p, top_k)
    return gumbel_argmax(logits, temperature, generator)


def dream_choice(
    logits: torch.Tensor,
    *,
    alg: str,
    temperature: float,
    top_p: float | None,
    top_k: int | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, confidence) as Dream's ``sample_tokens`` defines them.

    ``maskgit_plus``: probability of the chosen token; ``margin``: top1 - top2 probability;
    ``entropy``: negative entropy sum(p log p) (higher = more certain).
    """
    sample = temperature >= GREEDY_BELOW
    stat = {"maskgit_plus": "max_prob", "margin": "margin", "entropy": "entropy"}.get(alg)
    if not sample and stat is not None and (kernel := _fused(logits, top_p, top_k)) is not None:
        # fp32, as the softmax below. The token is the logits' argmax; "entropy" is -H exactly
        # (the reference's log(p + 1e-10) differs from it by at most V * 1e-10).
        st = kernel(logits, precision="fp32", need=(stat,))
        conf = getattr(st, stat)
        return st.token, (-conf if alg == "entropy" else conf)
    if sample:
        logits = logits / temperature
    logits = filter_top_p_top_k(logits, top_p, top_k)
    probs = torch.softmax(logits.float(), dim=-1)
    if sample:
        flat = probs.reshape(-1, probs.shape[-1])
        x0 = torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
        conf = torch.gather(probs, -1, x0[..., None]).squeeze(-1)
    else:
        conf, x0 = probs.max(-1)
    if alg == "margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif alg == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    elif alg != "maskgit_plus":
        raise ValueError(f"alg={alg!r}; valid: maskgit_plus, margin, entropy")
    return x0, conf


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of softmax(logits), computed in fp32; 0 * log 0 counts as 0.

    The runner sets the mask token's logit to -inf, so the naive ``p * log p`` would be NaN for
    every position (and d3LLM's entropy rule would never fire).
    """
    if (kernel := _fused(logits)) is not None:
        return kernel(logits, precision="fp32", need=("entropy",)).entropy
    logp = F.log_softmax(logits.float(), dim=-1)
    return -torch.where(logp > float("-inf"), logp.exp() * logp, torch.zeros_like(logp)).sum(-1)


def neg_entropy(logits: torch.Tensor, *, temperature: float | torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """``sum p log p`` (<= 0, higher = more certain) of the distribution tokens are drawn from, float64.

    Dream's ``neg_entropy`` confidence (the reference's LoPA ranking for D2F-Dream): the logits are
    tempered (T > 0) and top-p/top-k filtered first, as for sampling.
    """
    return -entropy(_sampling_logits(logits, temperature, top_p, top_k)).double()


def margin(logits: torch.Tensor, *, temperature: float | torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Top-1 minus top-2 probability (higher = more certain) of the distribution tokens are drawn
    from, float64: the references' ``margin`` ranking (D2F-eval ``margin_confidence``, LoPA ``margin``)."""
    probs = torch.softmax(_sampling_logits(logits, temperature, top_p, top_k).float(), dim=-1)
    top2 = torch.topk(probs, 2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).double()


def ranking_confidence(kind: str, logits: torch.Tensor, conf: torch.Tensor, *, temperature: float | torch.Tensor,
                       top_p: float | None, top_k: int | None) -> torch.Tensor:
    """The confidence a rule ranks positions by: ``prob`` is ``conf`` itself (the chosen token's
    probability), ``neg_entropy`` and ``margin`` are computed from ``logits`` as the references'
    ``sampling_strategy`` does. Thresholds never use this: they always compare probabilities."""
    if kind == "prob":
        return conf
    if kind == "neg_entropy":
        return neg_entropy(logits, temperature=temperature, top_p=top_p, top_k=top_k)
    if kind == "margin":
        return margin(logits, temperature=temperature, top_p=top_p, top_k=top_k)
    raise ValueError(f"ranking {kind!r}; valid: {', '.join(RANKINGS)}")


def _sampling_logits(logits: torch.Tensor, temperature: float | torch.Tensor, top_p: float | None,
                     top_k: int | None) -> torch.Tensor:
    """The logits tokens are drawn from: tempered (T > 0; one T per row for a tensor), then top-p / top-k
    filtered."""
    if torch.is_tensor(temperature):
        t = row_column(temperature, logits).to(logits.dtype)
        logits = torch.where(t >= GREEDY_BELOW, logits / t.clamp(min=GREEDY_BELOW), logits)
    elif temperature >= GREEDY_BELOW:
        logits = logits / temperature
    if top_p is not None or top_k is not None:
        logits = filter_top_p_top_k(logits, top_p, top_k)
    return logits
