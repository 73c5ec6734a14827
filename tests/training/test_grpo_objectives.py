"""GRPO objectives against hand-computed values: decoupled advantages, the TPF-aware filter, the
PPO/KL/NLL loss and its reductions."""

from __future__ import annotations

import math

import pytest
import torch

from dllm.training.rl_objectives import (
    accuracy_reward,
    advantages,
    batch_normalize,
    combined_rewards,
    group_minmax,
    group_zscore,
    grpo_loss,
    k3_kl,
    loss_weights,
    ppo_clip_terms,
    reduction_weights,
    tpf_filter,
)

ACC = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
TPF = torch.tensor([[2.0, 2.0, 4.0], [1.0, 2.0, 3.0]])
S2, S3 = math.sqrt(2.0), math.sqrt(1.5)  # z-scores of (2, 2, 4) are (-1/√2, -1/√2, √2); of (1, 2, 3): ±√1.5, 0


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               atol=tol, rtol=0)


def test_group_zscore_and_minmax_by_hand():
    close(group_zscore(TPF), [[-1 / S2, -1 / S2, S2], [-S3, 0.0, S3]])
    close(group_zscore(torch.tensor([[0.1, 0.1, 0.1]])), [[0.0, 0.0, 0.0]], tol=0)  # flat group: exactly 0
    close(group_minmax(TPF), [[0.0, 0.0, 1.0], [0.0, 0.5, 1.0]])
    close(group_minmax(torch.tensor([[3.0, 3.0]])), [[0.5, 0.5]])


def test_accuracy_reward_choices():
    close(accuracy_reward(ACC, "pm1"), [[1, -1, -1], [1, 1, 1]])  # the paper: ±1, not normalised
    close(accuracy_reward(ACC, "z_score"), [[S2, -1 / S2, -1 / S2], [0, 0, 0]])  # the released code
    close(accuracy_reward(ACC, "none"), ACC)
    with pytest.raises(ValueError):
        accuracy_reward(ACC, "bogus")


def test_decoupled_advantages_by_hand():
    # A = R_acc (±1) + R_tpf (z): group 1 = (1 - 1/√2, -1 - 1/√2, -1 + √2); group 2 = (1 - √1.5, 1, 1 + √1.5)
    a = [1 - 1 / S2, -1 - 1 / S2, -1 + S2, 1 - S3, 1.0, 1 + S3]
    close(combined_rewards(ACC, TPF).flatten(), a)
    mean = sum(a) / 6  # = 1/3
    std = math.sqrt(sum((x - mean) ** 2 for x in a) / 5)  # unbiased, as the reference
    close(mean, 1 / 3, tol=1e-12)
    close(advantages(ACC, TPF).flatten(), [(x - mean) / std for x in a])
    # released-code variant: accuracy z-scored too; an all-correct group gets only the speed signal
    b = [S2 - 1 / S2, -1 / S2 - 1 / S2, -1 / S2 + S2, -S3, 0.0, S3]
    close(combined_rewards(ACC, TPF, acc_norm="z_score").flatten(), b)
    # weights: tpf_weight=0 is plain accuracy GRPO
    close(combined_rewards(ACC, TPF, tpf_weight=0.0), [[1, -1, -1], [1, 1, 1]])
    # group normalisation instead of batch
    close(advantages(ACC, TPF, adv_norm="group"), group_zscore(combined_rewards(ACC, TPF)))
    close(advantages(ACC, TPF, adv_norm="none"), combined_rewards(ACC, TPF))


def test_non_decoupled_ablation_zscores_the_sum():
    # raw sum acc + tpf: (3, 2, 4) and (2, 3, 4) -> z-scores
    s = torch.tensor([[3.0, 2.0, 4.0], [2.0, 3.0, 4.0]])
    std = math.sqrt(2 / 3)
    close(combined_rewards(ACC, TPF, decoupled=False), (s - 3.0) / std)


def test_batch_normalize_with_global_stats_matches_local():
    a = torch.tensor([[1.0, 2.0], [5.0, -1.0]])
    stats = (float(a.sum()), float((a ** 2).sum()), a.numel())
    close(batch_normalize(a, stats=stats), batch_normalize(a))
    close(batch_normalize(torch.tensor([[2.0, 2.0]])), [[0.0, 0.0]])


def test_tpf_filter_by_hand():
    correct = torch.tensor([[1, 0], [0, 0], [1, 1], [1, 1], [0, 1], [1, 0]], dtype=torch.bool)
    tpf = torch.tensor([[1.0, 1.5],  # correct, range 0.5 -> keep
                        [1.0, 3.0],  # no correct rollout -> drop
                        [2.0, 2.0],  # all correct but TPF range 0 -> drop
                        [2.0, 2.01],  # all correct, range exactly delta (float 0.00999...) -> keep
                        [2.0, 2.009],  # range 0.009 < delta -> drop
                        [4.0, 1.0]])  # range 3 -> keep
    assert tpf_filter(correct, tpf, 0.01).tolist() == [True, False, False, True, False, True]
    assert tpf_filter(correct, tpf, 0.01, require_correct=False).tolist() == [True, True, False, True, False, True]
    assert tpf_filter(correct, tpf, 0.0).tolist() == [True, False, True, True, True, True]
    assert tpf_filter(correct, tpf, 0.0, require_correct=False).all()


def test_ppo_terms_by_hand():
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0]))
    old = torch.zeros(5)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0])
    surr, ratio, clipped = ppo_clip_terms(logp, old, adv, 0.2, 0.2)
    close(ratio, [1.5, 1.5, 0.5, 0.5, 1.0])
    close(surr, [1.2, -1.5, 0.5, -0.8, 2.0])
    assert clipped.tolist() == [True, False, False, True, False]
    # asymmetric clip (DAPO clip-higher style)
    surr, _, _ = ppo_clip_terms(logp[:1], old[:1], adv[:1], 0.2, 0.28)
    close(surr, [1.28])
    # the log-ratio clamp
    _, ratio, _ = ppo_clip_terms(torch.tensor([50.0]), torch.tensor([0.0]), torch.tensor([1.0]), ratio_clamp=10.0)
    close(ratio, [math.exp(10.0)], tol=1e-1)


def test_k3_by_hand():
    close(k3_kl(torch.tensor([0.0, math.log(0.5)]), torch.tensor([math.log(2.0), math.log(0.5)])),
          [2 - 1 - math.log(2), 0.0])
    assert bool((k3_kl(torch.randn(100), torch.randn(100)) >= 0).all())


def test_reduction_weights_by_hand():
    lengths = torch.tensor([2, 4])
    everyone = torch.tensor([True, True])
    close(reduction_weights(lengths, everyone, "sequence"), [1 / 4, 1 / 8])
    close(reduction_weights(lengths, everyone, "token"), [1 / 6, 1 / 6])
    close(reduction_weights(lengths, torch.tensor([False, True]), "token"), [0, 1 / 4])
    close(reduction_weights(lengths, torch.tensor([False, False]), "token"), [0, 0])


def test_grpo_loss_by_hand():
    """Two rollouts: lengths 2 and 1, advantages +1 and -1, rollout 1 verifier-correct."""
    lengths = torch.tensor([2, 1])
    correct = torch.tensor([True, False])
    w = loss_weights(lengths, correct, beta=0.5, mu=0.1)  # Seq-Tok-Tok
    close(w.pg, [1 / 4, 1 / 2])
    close(w.kl, [0.5 / 3, 0.5 / 3])
    close(w.nll, [0.1 / 2, 0.0])
    rows = torch.tensor([0, 0, 1])
    logp = torch.log(torch.tensor([0.5, 0.25, 0.5]))
    old = torch.log(torch.tensor([0.5, 0.5, 0.25]))  # ratios 1, 0.5 (clipped at 0.8 for A=+1), 2 (clip 1.2, A=-1)
    ref = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, sums = grpo_loss(logp, old, ref, adv, w.pg[rows], w.kl[rows], w.nll[rows])
    # PG: row 0 mean(min(1*1, 1), min(0.5, 0.8)) = 0.75; row 1: min(-2, -1.2) = -2  -> -(0.75 + -2)/2 = 0.625
    pg = -((1.0 + 0.5) / 2 + (-2.0)) / 2
    kl = (0.0 + (2 - 1 - math.log(2)) + 0.0) / 3
    nll = (math.log(2) + math.log(4)) / 2
    close(loss, pg + 0.5 * kl + 0.1 * nll)
    close(sums["pg_loss"], pg)
    assert int(sums["clipped"]) == 0  # 0.5 * +1 < 0.8 and 2 * -1 < 1.2 * -1: the unclipped branch is the min
    # old_logp=None: on-policy ratio 1 with the policy-gradient gradient
    lp = torch.log(torch.tensor([0.5, 0.25, 0.5])).requires_grad_()
    loss, _ = grpo_loss(lp, None, None, adv, w.pg[rows], w.kl[rows], torch.zeros(3))
    close(loss, -((1 + 1) / 2 - 1) / 2)
    loss.backward()
    close(lp.grad, -(adv * w.pg[rows]))


def test_nll_uses_the_explicit_correct_flag():
    """The released code's fallback ``correct := reward >= 0`` gives NLL to a wrong but fast rollout and
    withholds it from a correct slow one; the explicit flag does not."""
    lengths = torch.tensor([3, 3])
    correct = torch.tensor([False, True])  # rollout 0 wrong (but fast: reward >= 0), rollout 1 correct (slow)
    w = loss_weights(lengths, correct, beta=0.0, mu=1.0)
    close(w.nll, [0.0, 1 / 3])
