"""Losses and noise against hand computations."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from dllm.testing import EOS, MASK, PAD, tiny_llada
from dllm.training.data import collate
from dllm.training.objectives import (
    d2f_noise,
    distill_loss,
    monotonic_block_pmasks,
    result_slots,
    sft_loss,
    sft_noise,
)


def _batch():
    # two rows: prompts of 3 and 2 tokens (left-padded to 3), answers padded with EOS to 4
    return collate([([10, 11, 12], [20, 21, EOS]), ([13, 14], [22, EOS])], gen_length=4, pad_id=PAD, eos_id=EOS)


def test_collate_layout():
    b = _batch()
    assert b.prompt_length == 3
    assert b.input_ids.tolist() == [[10, 11, 12, 20, 21, EOS, EOS], [PAD, 13, 14, 22, EOS, EOS, EOS]]
    assert b.attention_mask.tolist() == [[1] * 7, [0] + [1] * 6]
    assert b.answer_mask.sum(1).tolist() == [4, 4]
    assert not b.answer_mask[:, :3].any()


def test_sft_noise_never_masks_the_prompt():
    b = _batch()
    g = torch.Generator().manual_seed(0)
    seen = torch.zeros_like(b.answer_mask)
    for _ in range(200):
        noisy, masked, p_mask = sft_noise(b.input_ids, b.answer_mask, MASK, g)
        assert not (masked & ~b.answer_mask).any()
        assert torch.equal(noisy[~masked], b.input_ids[~masked])
        assert (noisy[masked] == MASK).all()
        assert (p_mask >= 1e-3).all() and (p_mask <= 1).all()
        assert torch.equal(p_mask[:, 0], p_mask[:, -1])  # one p per row
        seen |= masked
    assert seen[:, 3:].all()  # every answer slot (EOS padding included) gets trained


def test_sft_loss_matches_hand_computation():
    torch.manual_seed(0)
    b, l, v = 2, 5, 7
    logits = torch.randn(b, l, v)
    targets = torch.randint(0, v, (b, l))
    masked = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    p = torch.tensor([0.3, 0.8])
    p_mask = p[:, None].expand(b, l)
    lengths = torch.tensor([5, 4])
    expected = 0.0
    for i in range(b):
        for j in range(l):
            if masked[i, j]:
                logp = logits[i, j, targets[i, j]] - torch.logsumexp(logits[i, j], dim=0)
                expected += -float(logp) / float(p[i]) / int(lengths[i])
    expected /= b
    got = sft_loss(logits, targets, masked, p_mask, lengths)
    assert math.isclose(float(got.detach()), expected, rel_tol=1e-5)


def test_sft_loss_token_weight_gamma_zero_is_plain_and_positive_favours_hard_tokens():
    torch.manual_seed(0)
    b, l, v = 2, 4, 5
    targets = torch.randint(0, v, (b, l))
    logits = torch.randn(b, l, v)
    logits[0, 0, targets[0, 0]] += 8.0  # one token the model already gets right
    masked = torch.ones(b, l, dtype=torch.bool)
    p_mask = torch.full((b, l), 0.5)
    lengths = torch.tensor([4, 4])
    plain = sft_loss(logits, targets, masked, p_mask, lengths)
    assert torch.equal(sft_loss(logits, targets, masked, p_mask, lengths, token_weight_gamma=0.0), plain)

    def grads(gamma):
        x = logits.clone().requires_grad_(True)
        sft_loss(x, targets, masked, p_mask, lengths, token_weight_gamma=gamma).backward()
        return x.grad.norm(dim=-1)

    g0, g2 = grads(0.0), grads(2.0)
    # the easy token's share of the gradient shrinks, the hard tokens' grows
    assert g2[0, 0] / g2.sum() < 0.1 * (g0[0, 0] / g0.sum())
    # hand computation: (1 - p)^gamma factors, rescaled to mean 1 over the masked tokens
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), reduction="none")
    f = (1 - torch.exp(-ce)) ** 2
    f = f / f.mean()
    expected = float((ce * f / (0.5 * 4)).sum() / b)
    got = sft_loss(logits, targets, masked, p_mask, lengths, token_weight_gamma=2.0)
    assert math.isclose(float(got), expected, rel_tol=1e-5)
    # equally hard tokens: the rescaling leaves the loss unchanged
    flat = torch.zeros(b, l, v)
    assert torch.allclose(sft_loss(flat, targets, masked, p_mask, lengths, token_weight_gamma=1.5),
                          sft_loss(flat, targets, masked, p_mask, lengths))


def test_token_weight_gamma_is_validated():
    from dllm.training.config import ConfigError, SFTConfig, validate

    with pytest.raises(ConfigError, match="token_weight_gamma"):
        validate(SFTConfig(token_weight_gamma=-1.0))


def test_sft_trainer_loss_uses_fixed_mask(monkeypatch, tokenizer):
    """SFTTrainer.compute_loss == hand CE/p/len with the mask forced (monkeypatched noise)."""
    import dllm.training.sft as sft_mod
    from dllm.training.config import SFTConfig

    model = tiny_llada()
    b = _batch()
    masked = torch.zeros_like(b.answer_mask)
    masked[0, 3] = masked[0, 5] = masked[1, 4] = True
    p = torch.tensor([0.5, 0.25])
    p_mask = p[:, None].expand_as(masked)
    noisy = torch.where(masked, torch.full_like(b.input_ids, MASK), b.input_ids)
    monkeypatch.setattr(sft_mod, "sft_noise", lambda *a, **k: (noisy, masked, p_mask))
    trainer = sft_mod.SFTTrainer(SFTConfig(model={"path": "tiny"}))
    trainer.tokenizer = type("T", (), {"mask_token_id": MASK})()
    got = trainer.compute_loss(model, b, torch.Generator())
    with torch.no_grad():
        logits = model(noisy, attention_mask=b.attention_mask).logits
    expected = 0.0
    for i, j in zip(*torch.nonzero(masked, as_tuple=True)):
        logp = torch.log_softmax(logits[i, j], -1)[b.input_ids[i, j]]
        expected += -float(logp) / float(p[i]) / 4  # answer length 4 (EOS padding included)
    expected /= 2
    assert math.isclose(float(got.detach()), expected, rel_tol=1e-5)


def test_monotonic_block_pmasks():
    g = torch.Generator().manual_seed(1)
    r = monotonic_block_pmasks(500, 6, g, 0.2, 0.7)
    assert r.shape == (500, 6)
    assert (r[:, 1:] >= r[:, :-1]).all()
    assert (r[:, 0] >= 0.2).all() and (r[:, 0] < 0.7).all()
    assert (r <= 0.7 + 1e-6).all()
    assert r[:, -1].mean() > r[:, 0].mean() + 0.05  # ratios really rise along the answer
    one = monotonic_block_pmasks(10, 1, g)
    assert one.shape == (10, 1)


def test_d2f_noise_block_structure():
    ids = torch.arange(3 * 11).view(3, 11) % 50
    p_len, bs = 3, 3  # answer of 8 slots -> blocks of 3, 3, 2
    answer = torch.zeros(3, 11, dtype=torch.bool)
    answer[:, p_len:] = True
    g = torch.Generator().manual_seed(2)
    noisy, masked, p_mask = d2f_noise(ids, p_len, bs, answer, MASK, g)
    assert (p_mask[:, :p_len] == 0).all() and not masked[:, :p_len].any()
    for blk in ([3, 4, 5], [6, 7, 8], [9, 10]):
        assert (p_mask[:, blk] == p_mask[:, blk[:1]]).all()  # one ratio per block
    assert (p_mask[:, 6] >= p_mask[:, 3]).all() and (p_mask[:, 9] >= p_mask[:, 6]).all()
    assert (noisy[masked] == MASK).all() and torch.equal(noisy[~masked], ids[~masked])


def test_distill_loss_matches_hand_computation():
    torch.manual_seed(3)
    s, t = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    masked = torch.tensor([[1, 0, 0, 1], [0, 1, 0, 0]], dtype=torch.bool)
    p_mask = torch.tensor([[0.5, 0.5, 0.6, 0.6], [0.2, 0.2, 0.9, 0.9]])
    terms = []
    for i, j in zip(*torch.nonzero(masked, as_tuple=True)):
        q = torch.softmax(t[i, j], -1)
        ce = -(q * torch.log_softmax(s[i, j], -1)).sum()
        terms.append(float(ce) / float(p_mask[i, j]))
    assert math.isclose(float(distill_loss(s, t, masked, p_mask)), sum(terms) / len(terms), rel_tol=1e-5)
    # identical distributions: the soft CE is the teacher's entropy (KL = 0)
    same = distill_loss(t, t, masked, torch.ones_like(p_mask))
    ent = [float(-(torch.softmax(t[i, j], -1) * torch.log_softmax(t[i, j], -1)).sum())
           for i, j in zip(*torch.nonzero(masked, as_tuple=True))]
    assert math.isclose(float(same), sum(ent) / len(ent), rel_tol=1e-5)
    assert float(distill_loss(s, t, torch.zeros_like(masked), p_mask)) == 0.0


def test_sft_noise_options_default_to_llada():
    b = _batch()
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a = sft_noise(b.input_ids, b.answer_mask, MASK, g1)
    c = sft_noise(b.input_ids, b.answer_mask, MASK, g2, 1e-3, 0.0, 0.0)
    assert all(torch.equal(x, y) for x, y in zip(a, c))
    g = torch.Generator().manual_seed(6)
    ps = torch.cat([sft_noise(b.input_ids, b.answer_mask, MASK, g, t_min=0.5)[2][:, 0] for _ in range(200)])
    assert ps.min() >= 0.5
    ps = torch.cat([sft_noise(b.input_ids, b.answer_mask, MASK, g, full_mask_prob=0.5)[2][:, 0] for _ in range(200)])
    assert 0.3 < float((ps == 1).float().mean()) < 0.7


def test_sft_noise_prefix_reveals_a_prefix_and_masks_only_after_it():
    b = _batch()
    g = torch.Generator().manual_seed(7)
    cuts = []
    for _ in range(300):
        # full_mask_prob=1: every slot after the cut is masked, so the cut is where masking starts
        noisy, masked, p_mask = sft_noise(b.input_ids, b.answer_mask, MASK, g, full_mask_prob=1.0, prefix_prob=1.0)
        assert not (masked & ~b.answer_mask).any()
        for row in range(2):
            m = masked[row, b.answer_mask[row]].tolist()
            cut = m.index(True)  # the last slot is never revealed: cut <= n_answer - 1
            assert m == [False] * cut + [True] * (len(m) - cut)
            assert (noisy[row, b.answer_mask[row]][:cut] == b.input_ids[row, b.answer_mask[row]][:cut]).all()
            cuts.append(cut)
    assert set(cuts) == {0, 1, 2, 3}  # uniform over the 4 answer slots


def test_sft_noise_prefix_prob_is_a_row_fraction_and_zero_is_the_default_stream():
    b = _batch()
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = sft_noise(b.input_ids, b.answer_mask, MASK, g1, full_mask_prob=0.5)
    c = sft_noise(b.input_ids, b.answer_mask, MASK, g2, full_mask_prob=0.5, prefix_prob=0.0)
    assert all(torch.equal(x, y) for x, y in zip(a, c))
    g = torch.Generator().manual_seed(4)
    partial = 0
    for _ in range(400):
        _, masked, _ = sft_noise(b.input_ids, b.answer_mask, MASK, g, full_mask_prob=1.0, prefix_prob=0.5)
        partial += int((masked[:, 3:].sum(1) < 4).sum())
    # revealed rows with a cut > 0 (3 of 4 cuts) are the only partially masked rows: 0.5 * 3/4 of 800
    assert 230 < partial < 370


# token ids of a made-up vocabulary: 40-49 digits, 50 the empty digit, 60 "=", 61 "#", 62 "+", 63 "."
_NUM = torch.tensor(list(range(40, 51)))
_TRIG = torch.tensor([60, 61])


def _worked_solution_batch():
    # "4 + 5 = 9 . 9 + 12 = 21 . # 21" and a row with no result (a lists-style answer)
    a = [44, 62, 45, 60, 49, 63, 49, 62, 41, 42, 60, 42, 41, 63, 61, 42, 41]
    return collate([([10, 11], a + [EOS]), ([12, 13], [20, 21, 22, EOS])], gen_length=20, pad_id=PAD, eos_id=EOS)


def test_result_slots_are_the_numbers_after_a_trigger_only():
    b = _worked_solution_batch()
    slots = result_slots(b.input_ids, _TRIG, _NUM)
    row = b.input_ids[0][slots[0]].tolist()
    assert row == [49, 42, 41, 42, 41]  # 9, 21 and the final 21; never the operands 4, 5, 9, 12
    assert not slots[1].any()


def test_sft_noise_result_mask_masks_exactly_the_results_in_chosen_rows():
    b = _worked_solution_batch()
    slots = result_slots(b.input_ids, _TRIG, _NUM)
    g = torch.Generator().manual_seed(0)
    exact = 0
    for _ in range(200):
        noisy, masked, p_mask = sft_noise(b.input_ids, b.answer_mask, MASK, g, t_min=0.5,
                                          result_mask_prob=0.5, result_slots=slots)
        assert not (masked & ~b.answer_mask).any()
        if torch.equal(masked[0], slots[0]):
            exact += 1
            assert (p_mask[0] == 1).all()
            assert (noisy[0][~slots[0]] == b.input_ids[0][~slots[0]]).all()
        assert masked[1].any()  # a row without results keeps the ordinary i.i.d. masks
    assert 70 < exact < 130  # about half of the rows that have results
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    plain = sft_noise(b.input_ids, b.answer_mask, MASK, g1, t_min=0.5)
    off = sft_noise(b.input_ids, b.answer_mask, MASK, g2, t_min=0.5, result_mask_prob=0.0, result_slots=slots)
    assert all(torch.equal(x, y) for x, y in zip(plain, off))


def test_sft_noise_result_cut_masks_from_a_result_to_the_end():
    """Row 0 of "4 + 5 = 9 . 9 + 12 = 21 . # 21" has three results (9, 21, the final 21): a cut row shows the
    answer up to one of them and masks it and everything after; every result is drawn as the cut."""
    b = _worked_solution_batch()
    slots = result_slots(b.input_ids, _TRIG, _NUM)
    answer = b.answer_mask[0].nonzero().flatten().tolist()
    first_result = [answer[4], answer[11], answer[15]]  # the positions of 9, 21 and the final 21
    g = torch.Generator().manual_seed(0)
    cuts = collections.Counter()
    for _ in range(300):
        noisy, masked, p_mask = sft_noise(b.input_ids, b.answer_mask, MASK, g, t_min=0.5,
                                          result_cut_prob=0.5, result_slots=slots)
        assert not (masked & ~b.answer_mask).any()
        row = masked[0].nonzero().flatten().tolist()
        tail = [i for i in answer if i >= row[0]] if row else []
        if row and row == tail and row[0] in first_result and (p_mask[0] == 1).all():
            cuts[row[0]] += 1
            assert (noisy[0][: row[0]] == b.input_ids[0][: row[0]]).all()  # the answer up to the cut is shown
            assert (noisy[0][row] == MASK).all()
        assert masked[1].any()  # a row without results keeps the ordinary i.i.d. masks
    assert set(cuts) == set(first_result)
    assert 110 < sum(cuts.values()) < 190  # about half of the rows that have results
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    plain = sft_noise(b.input_ids, b.answer_mask, MASK, g1, t_min=0.5)
    off = sft_noise(b.input_ids, b.answer_mask, MASK, g2, t_min=0.5, result_cut_prob=0.0, result_slots=slots)
    assert all(torch.equal(x, y) for x, y in zip(plain, off))
