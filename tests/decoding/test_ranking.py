"""Ranking options: ``d2f_confidence`` (the D2F rule's top-1 fallback) and ``lopa_confidence``.

Token-level agreement with the references is in test_reference_parity.py; these are the unit checks.
"""

from __future__ import annotations

import pytest
import torch

from dllm import DiffusionGenerationConfig
from dllm.decoding.config import RANKINGS
from dllm.decoding.errors import GenerationConfigError
from dllm.decoding.loops.pipeline import d2f_fill
from dllm.decoding.lopa import RoundResult
from dllm.decoding.lopa.scoring import winner_rankings
from dllm.decoding.sampling import margin, neg_entropy, ranking_confidence
from dllm.testing import tiny_dream


@pytest.mark.parametrize("field", ["d2f_confidence", "lopa_confidence"])
def test_rankings_are_validated(field):
    with pytest.raises(GenerationConfigError, match=f"{field}.*valid: prob, neg_entropy, margin"):
        DiffusionGenerationConfig(**{field: "entropy"})
    for kind in RANKINGS:
        cfg = DiffusionGenerationConfig(**{field: kind})
        assert DiffusionGenerationConfig.from_dict(cfg.to_dict()) == cfg
    assert getattr(DiffusionGenerationConfig(), field) == "prob"


def test_margin_is_top1_minus_top2_of_the_sampling_distribution():
    logits = torch.randn(3, 4, 20, generator=torch.Generator().manual_seed(1))
    top2 = logits.float().softmax(-1).topk(2).values
    assert torch.allclose(margin(logits, temperature=0.0, top_p=None, top_k=None), (top2[..., 0] - top2[..., 1]).double())
    # tempered and filtered as for sampling: top-k 1 leaves a certain distribution
    assert bool((margin(logits, temperature=0.5, top_p=None, top_k=1) == 1.0).all())


def test_ranking_confidence_dispatch():
    logits = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    conf = logits.double().softmax(-1).max(-1).values
    kw = dict(temperature=0.0, top_p=None, top_k=None)
    assert ranking_confidence("prob", logits, conf, **kw) is conf
    assert torch.equal(ranking_confidence("neg_entropy", logits, conf, **kw), neg_entropy(logits, **kw))
    assert torch.equal(ranking_confidence("margin", logits, conf, **kw), margin(logits, **kw))
    with pytest.raises(ValueError, match="valid: prob, neg_entropy, margin"):
        ranking_confidence("entropy", logits, conf, **kw)


def test_d2f_fill_thresholds_probabilities_and_ranks_only_the_fallback():
    conf = torch.tensor([[0.5, 0.4, 0.3]], dtype=torch.float64)
    rank = torch.tensor([[-2.0, -0.1, -1.0]], dtype=torch.float64)  # position 1 is the most certain by rank
    cand = torch.tensor([[True, True, True]])
    assert d2f_fill(conf, rank, cand, 0.9, complete=True).tolist() == [[False, True, False]]
    assert d2f_fill(conf, rank, cand, 0.9, complete=False).tolist() == [[False, False, False]]  # semi-activated
    # above the threshold the rank plays no part
    assert d2f_fill(conf, rank, cand, 0.45, complete=True).tolist() == [[True, False, False]]


@pytest.fixture(scope="module")
def bc_model():
    return tiny_dream(seed=0, initializer_range=0.1, attention_policy="block_causal", block_size=4)


PIPE = dict(max_new_tokens=16, block_length=4, block_add_threshold=0.5, decoded_token_threshold=0.6,
            skip_threshold=0.5, stop_at_eos=False, return_dict_in_generate=True)


def _prompts():
    return torch.randint(0, 60, (2, 6), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("kind", RANKINGS)
def test_lopa_without_lookaheads_is_d2f_with_the_same_fallback_ranking(bc_model, kind):
    ref = bc_model.generate(_prompts(), strategy="d2f", d2f_confidence=kind, **PIPE)
    for other in RANKINGS:  # lopa_confidence ranks branches only: with k = 0 it changes nothing
        out = bc_model.generate(_prompts(), strategy="lopa", lopa_branches=0, d2f_confidence=kind,
                                lopa_confidence=other, **PIPE)
        assert torch.equal(out.sequences, ref.sequences) and torch.equal(out.num_forwards, ref.num_forwards)


def test_the_fallback_ranking_changes_d2f_decisions(bc_model):
    runs = {k: bc_model.generate(_prompts(), strategy="d2f", d2f_confidence=k, **PIPE).sequences for k in RANKINGS}
    assert not torch.equal(runs["prob"], runs["neg_entropy"]) and not torch.equal(runs["prob"], runs["margin"])


def test_lopa_with_any_pair_of_rankings_runs(bc_model):
    for d2f_kind in RANKINGS:
        for lopa_kind in RANKINGS:
            out = bc_model.generate(_prompts(), strategy="lopa", lopa_branches=2, d2f_confidence=d2f_kind,
                                    lopa_confidence=lopa_kind, **PIPE)
            assert bool((out.num_forwards > 0).all())


def _result(rank=None, fill=None):
    z = torch.zeros(2, 3, dtype=torch.float64)
    return RoundResult(x0=z.long(), conf=z, score=torch.zeros(2, dtype=torch.float64), rank=rank, fill=fill)


def test_an_executor_missing_a_ranking_fails_loudly():
    """Branch-parallel executors return the lookahead ranking only: a config needing another fails."""
    cfg = DiffusionGenerationConfig(strategy="lopa", d2f_confidence="margin", lopa_confidence="neg_entropy")
    conf, winners = torch.rand(1, 3, dtype=torch.float64), torch.zeros(1, dtype=torch.long)
    ranked = torch.rand(2, 3, dtype=torch.float64)
    with pytest.raises(GenerationConfigError, match="d2f_confidence='margin'"):
        winner_rankings(_result(rank=ranked), cfg, winners, 1, conf, "cpu", cfg.d2f_confidence)
    with pytest.raises(GenerationConfigError, match="lopa_confidence='neg_entropy'"):
        winner_rankings(_result(), cfg, winners, 1, conf, "cpu", "prob")
    rank, fill = winner_rankings(_result(rank=ranked), cfg.replace(d2f_confidence="neg_entropy"), winners, 1, conf, "cpu",
                           "neg_entropy")
    assert fill is rank
