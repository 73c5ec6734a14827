"""TPF-aware GRPO (LightningRL) objectives as pure tensor functions.

Everything a GRPO update computes that does not run a model lives here, plus the three per-token
log-probability estimators of a dLLM rollout, expressed as *views*: a view is one canvas (the
generated region as the model sees it, prompt optionally noised) together with the tokens whose
log-probability that forward provides. Each loss token is the target of exactly one view, so any
chunking of the views gives the same per-token values and, with the per-token weights below, the
same gradient.

Conventions (one rollout = one row; G = generated-region length):

* ``lengths`` [n]: tokens up to and including the first EOS (G when there is none); the loss covers
  exactly these tokens (LightningRL broadcasts the advantage "up to and including the first EOS").
* ``step_map`` [n, G]: the 1-based forward of the row that committed each slot (-1: never).
* Rewards are per group: tensors shaped [groups, group_size].

See docs/rl.md for where the paper and the released code disagree and which side we take.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ESTIMATORS = ("block_masked", "trajectory", "d1")
ACC_NORMS = ("pm1", "z_score", "none")
TPF_NORMS = ("z_score", "minmax", "none")
ADV_NORMS = ("batch", "group", "none")
REDUCTIONS = ("sequence", "token")

# --------------------------------------------------------------------------------------------
# rewards -> advantages


def group_zscore(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(x - mean_g) / (std_g + eps) within each group (last dim), population std; 0 for a flat group.

    The flat case is explicit: the mean of identical floats is not always bit-equal to them.
    """
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, unbiased=False, keepdim=True)
    return torch.where(std > 1e-12, (x - mean) / (std + eps), torch.zeros_like(x))


def group_minmax(x: torch.Tensor) -> torch.Tensor:
    """(x - min_g) / (max_g - min_g) within each group; 0.5 for a flat group (reference ``minmax``)."""
    x = x.double()
    lo, hi = x.min(-1, keepdim=True).values, x.max(-1, keepdim=True).values
    span = hi - lo
    return torch.where(span > 1e-12, (x - lo) / span.clamp(min=1e-12), torch.full_like(x, 0.5))


def accuracy_reward(acc: torch.Tensor, norm: str = "pm1", eps: float = 1e-6) -> torch.Tensor:
    """The accuracy objective R_acc [groups, G] from verifier scores ``acc`` in [0, 1].

    ``pm1``: 2 acc - 1, not normalised (the paper: "we do not normalize the accuracy reward", ±1);
    ``z_score``: z-scored within the group (the released code, ``acc_norm: True``);
    ``none``: the raw score.
    """
    acc = acc.double()
    if norm == "pm1":
        return 2.0 * acc - 1.0
    if norm == "z_score":
        return group_zscore(acc, eps)
    if norm == "none":
        return acc
    raise ValueError(f"accuracy norm {norm!r}; valid: {', '.join(ACC_NORMS)}")


def tpf_reward(tpf: torch.Tensor, norm: str = "z_score", eps: float = 1e-6) -> torch.Tensor:
    """The speed objective R_tpf [groups, G]: z-score (paper Eq. 5), min-max or raw TPF."""
    if norm == "z_score":
        return group_zscore(tpf, eps)
    if norm == "minmax":
        return group_minmax(tpf)
    if norm == "none":
        return tpf.double()
    raise ValueError(f"tpf norm {norm!r}; valid: {', '.join(TPF_NORMS)}")


def batch_normalize(a: torch.Tensor, eps: float = 1e-8, stats: tuple[float, float, int] | None = None) -> torch.Tensor:
    """(a - mean_B) / max(std_B, eps) over every element (unbiased std, as the reference code).

    ``stats`` = (sum, sum of squares, count) over the whole batch when it is spread over processes.
    """
    a = a.double()
    if stats is None:
        n = a.numel()
        mean = a.mean() if n else a.new_zeros(())
        std = a.std(unbiased=True) if n > 1 else a.new_zeros(())
    else:
        s, ss, n = stats
        mean = torch.tensor(s / max(n, 1), dtype=torch.float64)
        var = (ss - n * float(mean) ** 2) / max(n - 1, 1)
        std = torch.tensor(max(var, 0.0), dtype=torch.float64).sqrt()
    return (a - mean) / torch.clamp(std, min=eps)


def combined_rewards(
    acc: torch.Tensor,
    tpf: torch.Tensor,
    *,
    acc_norm: str = "pm1",
    tpf_norm: str = "z_score",
    acc_weight: float = 1.0,
    tpf_weight: float = 1.0,
    decoupled: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A(i, j) [groups, G] before batch normalisation.

    Decoupled (paper Eq. 5-6): each objective normalised within the group on its own, then summed
    with weights. Not decoupled (the "w/o decoupled norm" ablation, standard GRPO): the weighted
    raw rewards are summed first and the sum is z-scored within the group.
    """
    if decoupled:
        return acc_weight * accuracy_reward(acc, acc_norm, eps) + tpf_weight * tpf_reward(tpf, tpf_norm, eps)
    return group_zscore(acc_weight * acc.double() + tpf_weight * tpf.double(), eps)


def advantages(
    acc: torch.Tensor,
    tpf: torch.Tensor,
    *,
    acc_norm: str = "pm1",
    tpf_norm: str = "z_score",
    acc_weight: float = 1.0,
    tpf_weight: float = 1.0,
    decoupled: bool = True,
    adv_norm: str = "batch",
    eps: float = 1e-6,
    batch_stats: tuple[float, float, int] | None = None,
) -> torch.Tensor:
    """Per-rollout advantages Â [groups, G] (paper Eq. 7 with ``adv_norm="batch"``)."""
    a = combined_rewards(acc, tpf, acc_norm=acc_norm, tpf_norm=tpf_norm, acc_weight=acc_weight,
                         tpf_weight=tpf_weight, decoupled=decoupled, eps=eps)
    if adv_norm == "batch":
        return batch_normalize(a, stats=batch_stats)
    if adv_norm == "group":
        return group_zscore(a, eps)
    if adv_norm == "none":
        return a
    raise ValueError(f"advantage norm {adv_norm!r}; valid: {', '.join(ADV_NORMS)}")


def tpf_filter(
    correct: torch.Tensor,
    tpf: torch.Tensor,
    delta: float = 0.01,
    *,
    require_correct: bool = True,
    tol: float = 1e-6,
) -> torch.Tensor:
    """Dynamic-sampling filter (paper Eq. 11): keep a group iff it has at least one verifier-correct
    rollout AND its TPF range max - min >= ``delta``. Returns keep [groups] bool.

    All-correct groups are kept (the speed objective still ranks them). ``delta <= 0`` disables the
    range test; ``tol`` absorbs float error at the boundary (2.01 - 2.00 >= 0.01).
    """
    keep = torch.ones(correct.shape[0], dtype=torch.bool, device=correct.device)
    if require_correct:
        keep &= correct.bool().any(-1)
    if delta > 0:
        t = tpf.double()
        keep &= (t.max(-1).values - t.min(-1).values) >= delta - tol
    return keep


# --------------------------------------------------------------------------------------------
# the loss


def ppo_clip_terms(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_clamp: float = 10.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token (surrogate, ratio, clipped) of the PPO objective (to be maximised).

    ρ = exp(clamp(ℓθ - ℓold, ±ratio_clamp)); surrogate = min(ρ Â, clip(ρ, 1-ε_low, 1+ε_high) Â);
    ``clipped`` marks tokens whose clipped branch is the minimum (they carry no gradient).
    """
    log_ratio = (logp - old_logp).clamp(-ratio_clamp, ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    return torch.minimum(unclipped, clipped), ratio, clipped < unclipped


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(πθ || πref) per token: exp(ℓref - ℓθ) - 1 - (ℓref - ℓθ) >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - 1.0 - d


def reduction_weights(lengths: torch.Tensor, select: torch.Tensor, kind: str,
                      totals: tuple[float, float] | None = None) -> torch.Tensor:
    """Per-sequence token weight w [n] such that Σ_i w_i Σ_{t<L_i} term(i, t) is the reduction.

    ``sequence``: mean over the selected sequences of each one's token mean, w_i = 1 / (n_sel L_i);
    ``token``: mean over all tokens of the selected sequences, w_i = 1 / Σ_sel L.
    Unselected sequences get 0; nothing selected -> all 0 (the term vanishes). ``totals``: (n_sel, Σ_sel L)
    of the whole minibatch when these rows are one process's part of it (the weights of the global reduction).
    """
    lengths = lengths.double()
    sel = select.bool()
    w = torch.zeros_like(lengths)
    if not bool(sel.any()):
        return w
    if totals is not None:
        count, tokens = totals
        if kind == "sequence":
            w[sel] = 1.0 / (float(count) * lengths[sel].clamp(min=1))
        elif kind == "token":
            w[sel] = 1.0 / max(float(tokens), 1.0)
        else:
            raise ValueError(f"reduction {kind!r}; valid: {', '.join(REDUCTIONS)}")
        return w
    if kind == "sequence":
        w[sel] = 1.0 / (sel.sum().double() * lengths[sel].clamp(min=1))
    elif kind == "token":
        w[sel] = 1.0 / lengths[sel].sum().clamp(min=1)
    else:
        raise ValueError(f"reduction {kind!r}; valid: {', '.join(REDUCTIONS)}")
    return w


@dataclass
class LossWeights:
    """Per-sequence weights of the three terms for one optimizer step's minibatch (see ``grpo_loss``)."""

    pg: torch.Tensor  # [n]
    kl: torch.Tensor  # [n]
    nll: torch.Tensor  # [n]


def loss_weights(
    lengths: torch.Tensor,
    correct: torch.Tensor,
    *,
    beta: float,
    mu: float,
    pg_reduction: str = "sequence",
    kl_reduction: str = "token",
    nll_reduction: str = "token",
    totals: tuple[tuple[float, float], tuple[float, float]] | None = None,
) -> LossWeights:
    """LightningRL's Seq-Tok-Tok default: L = -mean_seq(token-mean PPO) + β mean_tok(k3) + µ mean_tok∈correct(-ℓθ).

    ``correct`` [n] is the verifier's flag, passed explicitly (the released code recovers it as
    ``reward >= 0``, which mislabels rollouts once rewards are z-scored).
    ``totals``: ((rows, tokens) of every sequence, (rows, tokens) of the correct ones) over the whole minibatch
    when ``lengths`` are one process's part of it (``reduction_weights``).
    """
    everyone = torch.ones_like(correct, dtype=torch.bool)
    every, right = totals if totals is not None else (None, None)
    return LossWeights(
        pg=reduction_weights(lengths, everyone, pg_reduction, every),
        kl=beta * reduction_weights(lengths, everyone, kl_reduction, every),
        nll=mu * reduction_weights(lengths, correct.bool(), nll_reduction, right),
    )


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    w_pg: torch.Tensor,
    w_kl: torch.Tensor,
    w_nll: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ratio_clamp: float = 10.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of a set of tokens (flat tensors, one entry per token; weights already per token).

    L = Σ_t w_pg(t) · (−surrogate_t) + Σ_t w_kl(t) · k3_t + Σ_t w_nll(t) · (−ℓθ_t).
    ``old_logp=None``: the rollout policy is the current one (a single update per rollout batch),
    ρ = exp(ℓθ − sg(ℓθ)) = 1 with the policy gradient's value. ``ref_logp=None`` drops the KL term.
    Returns (loss, sums) where ``sums`` holds detached per-term sums for logging.
    """
    old = logp.detach() if old_logp is None else old_logp
    surr, ratio, clipped = ppo_clip_terms(logp, old, adv, clip_low, clip_high, ratio_clamp)
    pg = -(w_pg * surr).sum()
    loss = pg
    kl_sum = logp.new_zeros(())
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        loss = loss + (w_kl * kl).sum()
        kl_sum = kl.detach().sum()
    nll = (w_nll * -logp).sum()
    loss = loss + nll
    sums = {
        "pg_loss": pg.detach(), "nll_loss": nll.detach(), "kl_sum": kl_sum,
        "clipped": clipped.sum().detach(), "tokens": torch.tensor(float(logp.numel())),
        "ratio_sum": ratio.detach().sum(), "neg_logp_sum": -logp.detach().sum(),
    }
    return loss, sums


# --------------------------------------------------------------------------------------------
# log-probability estimators, as views


@dataclass
class Views:
    """Canvases whose forwards give every loss token's log-probability exactly once.

    ``row`` [V]: the rollout each view belongs to; ``gen`` [V, G]: the generated region as the
    model sees it (mask id where hidden); ``target`` [V, G]: the tokens read from this view;
    ``prompt_noise`` [V, P] or None: prompt slots replaced by the mask (d1).
    """

    row: torch.Tensor
    gen: torch.Tensor
    target: torch.Tensor
    prompt_noise: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.row.shape[0])

    def index(self, idx: torch.Tensor) -> Views:
        return Views(self.row[idx], self.gen[idx], self.target[idx],
                     None if self.prompt_noise is None else self.prompt_noise[idx])

    def last_target(self) -> torch.Tensor:
        """[V] the last targeted slot of each view (-1 if none)."""
        g = self.target.shape[1]
        cols = torch.arange(g, device=self.target.device).expand_as(self.target)
        return torch.where(self.target, cols, torch.full_like(cols, -1)).max(-1).values

    def first_target(self) -> torch.Tensor:
        g = self.target.shape[1]
        cols = torch.arange(g, device=self.target.device).expand_as(self.target)
        return torch.where(self.target, cols, torch.full_like(cols, g)).min(-1).values


def loss_mask(lengths: torch.Tensor, gen_length: int) -> torch.Tensor:
    """[n, G] True on the tokens a rollout is trained on (up to and including its first EOS)."""
    return torch.arange(gen_length, device=lengths.device)[None, :] < lengths[:, None]


def block_masked_views(gen_ids: torch.Tensor, mask: torch.Tensor, block_size: int, mask_id: int,
                       offsets: torch.Tensor | None = None) -> Views:
    """LightningRL's estimator: ℓ(x_i) = log p(x_i | prompt, clean blocks < b(i), block b(i) and
    everything after it masked). One view per (row, block holding a loss token).

    Blocks start at the generated region; ``offsets`` [n] (a position-aligned model decoded on its own
    grid: SDAR, Fast-dLLM v2) puts each row's first block ``offsets[r]`` slots into it (the prompt's
    last ``length % block`` tokens share it), as the model's blocks from position 0 fall.

    The reference gets all blocks from one forward over [noisy ‖ clean] with a custom attention
    mask; our model API takes attention *policies*, so the blocks of a row are separate canvases
    batched into the same forwards (same values; more compute for long sequences).
    """
    n, g = gen_ids.shape
    rows, gens, targets = [], [], []
    for r in range(n):
        shift = 0 if offsets is None else int(offsets[r])
        block_of = (torch.arange(g, device=gen_ids.device) + shift) // block_size
        for b in torch.unique(block_of[mask[r]]).tolist():
            hidden = block_of >= b
            rows.append(r)
            gens.append(torch.where(hidden, torch.full_like(gen_ids[r], mask_id), gen_ids[r]))
            targets.append(mask[r] & (block_of == b))
    return _stack_views(rows, gens, targets, g, gen_ids)


def trajectory_views(gen_ids: torch.Tensor, step_map: torch.Tensor, mask: torch.Tensor, mask_id: int) -> Views:
    """Exact replay of the decoding steps (TraceRL-style, the paper's per-step objective).

    At replay step s of a row the canvas holds exactly the tokens the row had committed before its
    forward s (1 <= step_map < s), every other slot masked; the tokens committed at step s are read
    from that forward. One view per (row, step that committed a loss token).
    """
    n, g = gen_ids.shape
    if bool((mask & (step_map < 1)).any()):
        raise ValueError("a loss token has no decoding step (step_map < 1): the trajectory estimator needs the "
                         "step map of the rollout that produced these tokens")
    rows, gens, targets = [], [], []
    for r in range(n):
        for s in torch.unique(step_map[r][mask[r]]).tolist():
            visible = (step_map[r] >= 1) & (step_map[r] < s)
            rows.append(r)
            gens.append(torch.where(visible, gen_ids[r], torch.full_like(gen_ids[r], mask_id)))
            targets.append(mask[r] & (step_map[r] == s))
    return _stack_views(rows, gens, targets, g, gen_ids)


def d1_views(gen_ids: torch.Tensor, mask: torch.Tensor, mask_id: int, prompt_valid: torch.Tensor,
             p_mask_prompt: float, generator: torch.Generator | None) -> Views:
    """diffu-GRPO's one-step estimate: the whole completion masked, each (real) prompt token masked
    independently with ``p_mask_prompt``. One view per row; draw it once and reuse it for the old,
    reference and current log-probs so the ratios compare identical masks."""
    g = gen_ids.shape[1]
    noise = (torch.rand(prompt_valid.shape, generator=generator).to(prompt_valid.device) < p_mask_prompt)
    noise &= prompt_valid.bool()
    keep = mask.any(-1)
    idx = torch.nonzero(keep).flatten()
    gen = torch.full((len(idx), g), mask_id, dtype=gen_ids.dtype, device=gen_ids.device)
    return Views(idx, gen, mask[idx].clone(), noise[idx])


def _stack_views(rows, gens, targets, g, like: torch.Tensor) -> Views:
    if not rows:
        empty = torch.zeros((0, g), dtype=like.dtype, device=like.device)
        return Views(torch.zeros(0, dtype=torch.long, device=like.device), empty, empty.bool())
    return Views(torch.tensor(rows, dtype=torch.long, device=like.device), torch.stack(gens), torch.stack(targets))


def view_logprobs(
    model,
    views: Views,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    gen_ids: torch.Tensor,
    *,
    mask_id: int,
    suppress_mask: bool = True,
    temperature: float = 1.0,
    block_causal_size: int | None = None,
    forward_kwargs: dict | None = None,
) -> torch.Tensor:
    """log πθ(token | view canvas) [V, G] for the views' rollouts (0 where not a target).

    The canvas is ``[prompt | view.gen]`` with the rollout's (left-padded) prompt. ``suppress_mask``
    and ``temperature`` reproduce the sampling distribution of the decoder (the mask token is never
    sampled; tokens are drawn from softmax(logits / T)). ``block_causal_size``: the model attends
    block-causally with this block size, so slots after the last targeted block are dropped from
    the forward (they cannot influence the targets).
    """
    v, g = views.gen.shape
    p = prompt_ids.shape[1]
    if v == 0:
        return torch.zeros((0, g), device=gen_ids.device)
    rows = views.row
    prompt = prompt_ids[rows]
    if views.prompt_noise is not None:
        prompt = torch.where(views.prompt_noise, torch.full_like(prompt, mask_id), prompt)
    first = int(views.first_target().min())
    last = int(views.last_target().max())
    end = g
    kwargs = {"prompt_length": p, **(forward_kwargs or {})}
    gen = views.gen
    if block_causal_size and kwargs["prompt_length"] is None:
        # the model's grid from position 0 (sdar, fast_dllm_v2): the block holding `last` ends within
        # block_causal_size slots of it, possibly past the budget, where the decoder kept masks
        end = last + block_causal_size
        if end > g:
            gen = torch.cat([gen, torch.full((v, end - g), mask_id, dtype=gen.dtype, device=gen.device)], 1)
    elif block_causal_size:  # blocks start at the generated region
        end = min(g, -(-(last + 1) // block_causal_size) * block_causal_size)
    x = torch.cat([prompt, gen[:, :end]], dim=1)
    attn = torch.cat([prompt_mask[rows], torch.ones((v, end), dtype=prompt_mask.dtype, device=prompt_mask.device)], 1)
    logits = model(x, attention_mask=attn, logits_range=(p + first, p + last + 1), **kwargs).logits.float()
    if suppress_mask:
        logits = logits.masked_fill(
            torch.arange(logits.shape[-1], device=logits.device) == mask_id, float("-inf"))
    if temperature and temperature != 1.0:
        logits = logits / temperature
    tokens = gen_ids[rows][:, first : last + 1]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[..., None]).squeeze(-1)
    out = torch.zeros((v, g), dtype=lp.dtype, device=lp.device)
    out = torch.cat([out[:, :first], lp, out[:, last + 1 :]], dim=1)
    return torch.where(views.target, out, torch.zeros_like(out))


def scatter_views(values: torch.Tensor, views: Views, n: int) -> torch.Tensor:
    """Sum view values [V, G] (0 off target) into per-rollout [n, G] tensors (each token has one view)."""
    out = torch.zeros((n, values.shape[1]), dtype=values.dtype, device=values.device)
    return out.index_add(0, views.row, torch.where(views.target, values, torch.zeros_like(values)))


def chunk_views(views: Views, chunk: int, sort: bool = True) -> list[Views]:
    """Split views into forward-sized chunks; sorted by last target so truncated canvases group well."""
    if len(views) == 0:
        return []
    order = torch.argsort(views.last_target(), stable=True) if sort else torch.arange(len(views))
    return [views.index(order[i : i + chunk]) for i in range(0, len(views), max(1, chunk))]
