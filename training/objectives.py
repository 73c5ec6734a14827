"""Training objectives as pure tensor functions: noising and losses.

* LLaDA SFT (GUIDELINES): t ~ U(0,1) per sample, p = (1 - eps) t + eps, every answer token masked
  i.i.d. with p (never the prompt), CE on masked tokens divided by p, each row normalised by its
  answer length (EOS padding included), averaged over the batch.
* D2F (spec d2f-lopa §1): per-block mask ratios rising monotonically along the answer
  (``generate_monotonic_pmasks``), and the asymmetric distillation loss: soft CE from the
  bidirectional teacher's distribution to the block-causal student, / p_mask, mean over masked tokens.

Random draws take an explicit ``torch.Generator`` (on the CPU, so a run is reproducible on any
device and resumable from the generator's saved state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _rand(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    return torch.rand(shape, generator=generator).to(device)


def sft_noise(
    input_ids: torch.Tensor,
    answer_mask: torch.Tensor,
    mask_id: int,
    generator: torch.Generator | None = None,
    eps: float = 1e-3,
    full_mask_prob: float = 0.0,
    t_min: float = 0.0,
    prefix_prob: float = 0.0,
    result_mask_prob: float = 0.0,
    result_slots: torch.Tensor | None = None,
    result_cut_prob: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy ids, masked [b,l] bool, p_mask [b,l]): answer tokens masked i.i.d. with a per-row p.

    Two departures from LLaDA, both off by default (``t_min=0``, ``full_mask_prob=0``): t ~ U(t_min, 1)
    and p = 1 for a ``full_mask_prob`` fraction of rows. Rows with few masks let a small model fill a
    slot from its answer neighbours, and that shortcut keeps it from learning to read the prompt
    (measured: list copy learned in <400 steps with t_min=0.5, not at all with t_min=0).

    A third, ``prefix_prob`` (default 0): in that fraction of rows the answer is revealed up to a cut
    drawn uniformly over its slots, and only the slots after the cut can be masked. Semi-autoregressive
    decoding commits a worked solution roughly left to right, so a step's operands are on the canvas
    while its result is still masked; i.i.d. masks at p >= 0.5 almost never show a small model that
    state (``benchmarks/gsm_step_probe.py`` on the step-14000 ``tiny``: with the reference solution
    given up to the ``=``, step 1, operands from the prompt, right 85%; step 2, operands from the
    answer, 12%).

    A fourth, ``result_mask_prob`` (default 0): in that fraction of the rows that have any
    ``result_slots`` ([b, l] bool, from ``result_slots``), exactly those slots are masked (p = 1) and
    the rest of the answer is shown. For a worked solution these are the results of its steps, so
    every step is trained with its operands visible, including operands that are earlier results.
    Every later copy of a result stays visible, though (the next step's first operand, the final
    answer), so a model can fill the slots by copying them.

    A fifth, ``result_cut_prob`` (default 0): in that fraction of the rows that have any result slots,
    one result is drawn uniformly among the row's results, the answer is shown up to it, and it and
    everything after it are masked (p = 1). That is the state in which a decoder that fills a worked
    solution left to right meets each result, with no later copy of it to read: only the arithmetic
    gives it. Drawn after ``result_mask_prob``, and it takes the rows it draws.
    """
    b, l = input_ids.shape
    t = _rand((b,), generator, input_ids.device)
    if t_min > 0:
        t = t_min + (1 - t_min) * t
    p = (1 - eps) * t + eps
    if full_mask_prob > 0:  # drawn only when enabled, so the LLaDA path's random stream is unchanged
        p = torch.where(_rand((b,), generator, input_ids.device) < full_mask_prob, torch.ones_like(p), p)
    p_mask = p[:, None].expand(b, l)
    masked = (_rand((b, l), generator, input_ids.device) < p_mask) & answer_mask
    if prefix_prob > 0:  # drawn only when enabled (same reason as above)
        masked = masked & ~_revealed_prefix(answer_mask, prefix_prob, generator)
    if result_mask_prob > 0 and result_slots is not None:  # drawn only when enabled
        slots = result_slots & answer_mask
        chosen = (_rand((b,), generator, input_ids.device) < result_mask_prob) & slots.any(dim=1)
        masked = torch.where(chosen[:, None], slots, masked)
        p_mask = torch.where(chosen[:, None], torch.ones_like(p_mask), p_mask)
    if result_cut_prob > 0 and result_slots is not None:  # drawn only when enabled
        chosen, cut = _result_cut(result_slots & answer_mask, answer_mask, result_cut_prob, generator)
        masked = torch.where(chosen[:, None], cut, masked)
        p_mask = torch.where(chosen[:, None], torch.ones_like(p_mask), p_mask)
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return noisy, masked, p_mask


def _revealed_prefix(answer_mask: torch.Tensor, prefix_prob: float,
                     generator: torch.Generator | None) -> torch.Tensor:
    """[b, l] True on the answer slots before each chosen row's cut (cut ~ U{0, ..., n_answer - 1})."""
    b = answer_mask.shape[0]
    chosen = _rand((b,), generator, answer_mask.device) < prefix_prob
    n_answer = answer_mask.sum(dim=1)
    cut = (_rand((b,), generator, answer_mask.device) * n_answer).floor().long()
    rank = answer_mask.long().cumsum(dim=1) - 1  # 0-based index of each answer slot within its row
    return answer_mask & chosen[:, None] & (rank < cut[:, None])


def _result_cut(slots: torch.Tensor, answer_mask: torch.Tensor, prob: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen [b] bool, [b, l] bool): for each chosen row (one with results, drawn with ``prob``), the
    answer slots from the first slot of a result run drawn uniformly among the row's runs to the end."""
    b = slots.shape[0]
    starts = slots.clone()
    starts[:, 1:] &= ~slots[:, :-1]  # the first slot of each run
    n_runs = starts.sum(dim=1)
    chosen = (_rand((b,), generator, slots.device) < prob) & (n_runs > 0)
    pick = (_rand((b,), generator, slots.device) * n_runs).floor().long()  # 0-based run index
    at = starts & (starts.long().cumsum(dim=1) - 1 == pick[:, None])
    return chosen, answer_mask & (at.long().cumsum(dim=1) > 0)


def result_slots(input_ids: torch.Tensor, trigger_ids: torch.Tensor, number_ids: torch.Tensor) -> torch.Tensor:
    """[b, l] True on each run of number tokens that directly follows a trigger token.

    With triggers ``=`` and ``#`` these are the step results and the final answer of a worked
    solution (``9 * 14 = 126 . 126 + 36 = 162 . #### 162``), never its operands.
    """
    is_trigger = torch.isin(input_ids, trigger_ids)
    is_number = torch.isin(input_ids, number_ids)
    out = torch.zeros_like(is_number)
    inside = torch.zeros_like(is_number[:, 0])
    for j in range(1, input_ids.shape[1]):  # answers are short; a loop is clearer than a scan
        inside = is_number[:, j] & (inside | is_trigger[:, j - 1])
        out[:, j] = inside
    return out


def sft_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    masked: torch.Tensor,
    p_mask: torch.Tensor,
    answer_lengths: torch.Tensor,
    token_weight_gamma: float = 0.0,
) -> torch.Tensor:
    """LLaDA SFT loss: sum over masked tokens of CE / p / answer_length(row), divided by the batch size.

    ``logits`` [b, l, V] align with ``targets`` [b, l] (pass the answer columns only to save memory);
    ``answer_lengths`` [b] counts each row's answer slots, EOS padding included.

    ``token_weight_gamma`` > 0 (extra, not LLaDA) adds adaptive token-level reweighting in the spirit
    of MGDM (Ye et al., "Beyond Autoregression", 2024): each masked token's term is multiplied by
    ``(1 - p_target) ** gamma``, where ``p_target`` is the probability the model gives the right
    token (taken without gradient), so tokens the model already gets right (EOS padding, copied digits) weigh less than
    the few hard ones (which operation, which operand). The factors are rescaled to mean 1 over
    the batch's masked tokens, so the learning rate keeps its meaning; gamma 0 is the plain loss.
    """
    b = targets.shape[0]
    rows = torch.arange(b, device=targets.device)[:, None].expand_as(targets)[masked]
    ce = F.cross_entropy(logits[masked].float(), targets[masked], reduction="none")
    weight = 1.0 / (p_mask[masked].float() * answer_lengths[rows].float())
    if token_weight_gamma > 0 and ce.numel():
        hard = (1.0 - torch.exp(-ce.detach())).clamp(min=0.0) ** token_weight_gamma
        weight = weight * hard / hard.mean().clamp(min=1e-12)
    return (ce * weight).sum() / b


def t2t_corrupt(
    noisy: torch.Tensor,
    masked: torch.Tensor,
    answer_mask: torch.Tensor,
    prob: float,
    vocab_size: int,
    mask_id: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LLaDA2.1's token-to-token noise: (noisy ids, visible [b, l] bool).

    Each answer token the mask left visible is replaced, with probability ``prob``, by a token drawn
    uniformly from the vocabulary without ``[MASK]``. ``visible`` marks every visible answer slot,
    replaced or not: the T2T loss asks the clean token at all of them, because a model that only saw
    replaced tokens there would learn to change every committed token.
    """
    visible = answer_mask & ~masked
    flip = (_rand(noisy.shape, generator, noisy.device) < prob) & visible
    drawn = (_rand(noisy.shape, generator, noisy.device) * (vocab_size - 1)).long()
    drawn = drawn + (drawn >= mask_id).long()  # skip [MASK]
    return torch.where(flip, drawn, noisy), visible


def t2t_loss(logits: torch.Tensor, targets: torch.Tensor, visible: torch.Tensor,
             answer_lengths: torch.Tensor) -> torch.Tensor:
    """CE to the clean token on the visible answer slots, each row normalised by its answer length (as
    :func:`sft_loss`), divided by the batch size."""
    b = targets.shape[0]
    rows = torch.arange(b, device=targets.device)[:, None].expand_as(targets)[visible]
    ce = F.cross_entropy(logits[visible].float(), targets[visible], reduction="none")
    return (ce / answer_lengths[rows].float()).sum() / b


def monotonic_block_pmasks(
    num_rows: int,
    num_blocks: int,
    generator: torch.Generator | None = None,
    low: float = 0.2,
    high: float = 0.7,
) -> torch.Tensor:
    """[rows, blocks] non-decreasing mask ratios (D2F ``generate_monotonic_pmasks``).

    p_1 ~ U[low, high); for k = 2..N, Δ_k ~ U[0, (high - p_1) / (N - 1)]; p_b = p_1 + Σ_{k<=b} Δ_k,
    so p never exceeds ``high`` (clamped to 1 for safety).
    """
    p1 = low + (high - low) * torch.rand((num_rows, 1), generator=generator)
    if num_blocks == 1:
        return p1.clamp(max=1.0)
    span = (high - p1) / (num_blocks - 1)
    deltas = torch.rand((num_rows, num_blocks - 1), generator=generator) * span
    return torch.cat([p1, p1 + deltas.cumsum(dim=1)], dim=1).clamp(max=1.0)


def d2f_noise(
    input_ids: torch.Tensor,
    prompt_length: int,
    block_size: int,
    answer_mask: torch.Tensor,
    mask_id: int,
    generator: torch.Generator | None = None,
    low: float = 0.2,
    high: float = 0.7,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy ids, masked, p_mask): answer slot s >= P masked with its block's ratio p_{(s-P)//B}."""
    b, l = input_ids.shape
    gen_len = l - prompt_length
    n_blocks = max(1, -(-gen_len // block_size))
    ratios = monotonic_block_pmasks(b, n_blocks, generator, low, high)  # [b, N]
    block_of_slot = torch.arange(gen_len) // block_size
    p_mask = torch.zeros((b, l))
    p_mask[:, prompt_length:] = ratios[:, block_of_slot]
    p_mask = p_mask.to(input_ids.device)
    masked = (_rand((b, l), generator, input_ids.device) < p_mask) & answer_mask
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return noisy, masked, p_mask


def soft_cross_entropy(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """-Σ_v softmax(teacher)_v log softmax(student)_v over the last dim (KL(teacher||student) + const)."""
    teacher = F.softmax(teacher_logits.float(), dim=-1)
    return -(teacher * F.log_softmax(student_logits.float(), dim=-1)).sum(-1)


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    masked: torch.Tensor,
    p_mask: torch.Tensor,
) -> torch.Tensor:
    """D2F loss: mean over masked tokens of soft-CE(teacher -> student) / p_mask (0 if nothing is masked)."""
    if not bool(masked.any()):
        return student_logits.sum() * 0.0
    ce = soft_cross_entropy(student_logits[masked], teacher_logits[masked])
    return (ce / p_mask[masked].float()).mean()
