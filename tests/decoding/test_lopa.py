"""LoPA (lookahead multi-branch decoding): invariants against d2f / threshold, branch structure, accounting."""

import pytest
import torch

from dllm.decoding import lopa
from dllm.decoding.lopa import branch_scores, select_winners, top_lookaheads
from dllm.decoding.sampling import neg_entropy
from dllm.generation import DiffusionGenerationConfig, GenerationConfigError
from dllm.testing import EOS, MASK, PAD, tiny_dream, tiny_llada
from dllm.text import left_pad

G, B = 16, 4
PIPE = dict(block_add_threshold=0.25, decoded_token_threshold=0.5, skip_threshold=0.6)  # overlapping blocks


@pytest.fixture(scope="module")
def bc_model():
    return tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B)


@pytest.fixture(scope="module")
def bc_dream():
    return tiny_dream(initializer_range=0.5, attention_policy="block_causal", block_size=B)


@pytest.fixture(scope="module")
def bi_model():
    return tiny_llada(initializer_range=0.5)


@pytest.fixture(scope="module")
def bi_dream():
    return tiny_dream(initializer_range=0.5)


def _prompt(b=1, length=7, seed=0):
    return torch.randint(0, 60, (b, length), generator=torch.Generator().manual_seed(seed))


def _gen(model, prompt, attention_mask=None, **kw):
    kw.setdefault("max_new_tokens", G)
    kw.setdefault("block_length", B)
    kw.setdefault("stop_at_eos", False)
    return model.generate(prompt, attention_mask=attention_mask, return_dict_in_generate=True, **kw)


def _same(a, b):
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.num_forwards, b.num_forwards)
    assert torch.equal(a.step_map, b.step_map)
    assert a.finish_reason == b.finish_reason


def _left_pad(prompts):
    return left_pad(prompts, PAD)


# ------------------------------------------------------------------------------- pure pieces
def test_branch_score_is_mean_remaining_confidence_with_reference_variants():
    conf = torch.tensor([[0.9, 0.5, 0.7, 0.1], [0.2, 0.4, 0.6, 0.8], [0.3, 0.3, 0.3, 0.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    creation = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    s = branch_scores(conf, mask, creation, alpha=0.0, rho=1.0)
    assert s.tolist() == pytest.approx([0.7, 0.5, 1.0])  # no mask left -> 1.0
    # rho: mean of the lowest max(1, floor(rho * n))
    s = branch_scores(conf, mask, creation, alpha=0.0, rho=0.5)
    assert s.tolist() == pytest.approx([0.5, 0.3, 1.0])
    s = branch_scores(conf, mask, creation, alpha=0.0, rho=0.01)
    assert s.tolist() == pytest.approx([0.5, 0.2, 1.0])
    s = branch_scores(conf, mask, creation, alpha=0.5, rho=1.0)
    assert s.tolist() == pytest.approx([0.85, 0.5, 0.625])


def test_winner_tie_break_lookaheads_first_lowest_id_anchor_last():
    R, Gr = 3, 4  # 3 rows, anchor + 3 lookaheads, branch-major [group, row]
    score = torch.tensor([
        [0.5, 0.9, 0.7],   # anchor
        [0.5, 0.2, 0.7],   # lookahead 1
        [0.4, 0.9, 0.8],   # lookahead 2
        [0.5, 0.1, 0.8],   # lookahead 3
    ], dtype=torch.float64).flatten()
    assert select_winners(score, R, Gr).tolist() == [1, 2, 2]
    assert select_winners(score, R, Gr, force_anchor=True).tolist() == [0, 0, 0]
    strict = torch.tensor([[0.6], [0.5], [float("-inf")], [0.59]], dtype=torch.float64).flatten()
    assert select_winners(strict, 1, 4).tolist() == [0]  # the anchor wins only when strictly better


def test_lookahead_positions_are_top_k_confident_candidates():
    conf = torch.tensor([[0.3, 0.9, 0.5, 0.9, 0.99], [0.1, 0.2, 0.3, 0.4, 0.5]], dtype=torch.float64)
    tok = torch.arange(10).view(2, 5)
    cand = torch.tensor([[1, 1, 1, 1, 0], [0, 0, 1, 0, 0]], dtype=torch.bool)
    out = top_lookaheads(conf, tok, cand, 3)
    assert out[0] == [(1, 1, 0.9), (3, 3, 0.9), (2, 2, 0.5)]  # ties -> lower offset; non-candidates never
    assert out[1] == [(2, 7, 0.3)]  # fewer candidates than k
    assert top_lookaheads(conf, tok, cand, 0) == [[], []]


# ------------------------------------------------------------------------------- k = 0 == base rule
@pytest.mark.parametrize("kw", [PIPE, dict(skip_threshold=0.9), dict(block_add_threshold=1.0, decoded_token_threshold=1.0, skip_threshold=0.5)])
@pytest.mark.parametrize("which", ["llada", "dream"])
@pytest.mark.parametrize("seed", [0, 6])
def test_k0_equals_d2f_token_for_token_forward_for_forward(bc_model, bc_dream, which, seed, kw):
    m = bc_model if which == "llada" else bc_dream
    p = _prompt(seed=seed)
    ref = _gen(m, p, strategy="d2f", **kw)
    out = _gen(m, p, strategy="lopa", lopa_branches=0, **kw)
    _same(ref, out)
    assert out.stats["forwards"] == ref.stats["forwards"] == out.stats["steps"]


def test_k0_equals_d2f_when_sampling(bc_model):
    p = _prompt(seed=3)
    ref = _gen(bc_model, p, strategy="d2f", temperature=0.8, seed=11, **PIPE)
    out = _gen(bc_model, p, strategy="lopa", temperature=0.8, seed=11, **PIPE)
    _same(ref, out)


@pytest.mark.parametrize("cache", ["dual", "prefix", "none"])
@pytest.mark.parametrize("which", ["llada", "dream"])
def test_k0_equals_threshold_on_bidirectional_models(bi_model, bi_dream, which, cache):
    m = bi_model if which == "llada" else bi_dream
    p = _prompt(seed=4)
    ref = _gen(m, p, strategy="threshold", threshold=0.7, cache=cache)
    out = _gen(m, p, strategy="lopa", threshold=0.7, cache=cache)
    _same(ref, out)
    assert out.stats["forwards"] == ref.stats["forwards"]


def _eos_model(**kw):
    """Random weights whose head prefers EOS for many hidden states (rows stop at different rounds)."""
    m = tiny_llada(initializer_range=0.5, **kw)
    with torch.no_grad():
        head = m.model.transformer["ff_out"].weight
        head[EOS] = head[EOS] * 0 + m.model.transformer["ln_f"].weight.sign() * 3.0
    return m


@pytest.mark.parametrize("base,extra,kw", [
    ("d2f", dict(attention_policy="block_causal", block_size=B), PIPE),
    ("threshold", {}, dict(threshold=0.7, cache="dual")),
])
def test_k0_equals_base_rule_with_eos_stops_in_a_batch(base, extra, kw):
    m = _eos_model(**extra)
    ids, mask = _left_pad([_prompt(1, n, seed=n)[0].tolist() for n in (5, 9, 7)])
    ref = _gen(m, ids, attention_mask=mask, strategy=base, stop_at_eos=True, max_new_tokens=32, **kw)
    out = _gen(m, ids, attention_mask=mask, strategy="lopa", stop_at_eos=True, max_new_tokens=32, **kw)
    _same(ref, out)
    assert "stop" in out.finish_reason and len(set(out.num_forwards.tolist())) > 1  # rows left at different rounds
    forced = _gen(m, ids, attention_mask=mask, strategy="lopa", lopa_branches=3, lopa_force_anchor=True,
                  stop_at_eos=True, max_new_tokens=32, **kw)
    _same(ref, forced)


# ------------------------------------------------------------------------------- forced anchor
@pytest.mark.parametrize("k", [1, 3, 8])
def test_forced_anchor_reproduces_k0_block_causal(bc_model, k):
    p = _prompt(seed=6)
    ref = _gen(bc_model, p, strategy="lopa", lopa_branches=0, **PIPE)
    out = _gen(bc_model, p, strategy="lopa", lopa_branches=k, lopa_force_anchor=True, **PIPE)
    _same(ref, out)
    assert all(w == 0 for w in out.stats["lopa_winners"][0])
    assert out.stats["lopa_branch_rows"] > ref.stats["lopa_branch_rows"]  # the lookaheads were evaluated


@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("cache", ["dual", "none"])
def test_forced_anchor_reproduces_k0_bidirectional(bi_model, k, cache):
    p = _prompt(seed=4)
    ref = _gen(bi_model, p, strategy="threshold", threshold=0.7, cache=cache)
    out = _gen(bi_model, p, strategy="lopa", threshold=0.7, cache=cache, lopa_branches=k, lopa_force_anchor=True)
    _same(ref, out)


# ------------------------------------------------------------------------------- accounting, structure
class _Spy:
    """Wraps the local executor: records every round request and the logits width each rank returns."""

    def __init__(self):
        self.requests, self.results = [], []

    def __call__(self, model, **kw):
        inner = lopa.local_executor(model, **kw)
        spy = self
        run = inner.run

        def recording_run(req):
            res = run(req)
            spy.requests.append(req)
            spy.results.append(res)
            return res

        inner.run = recording_run
        return inner


@pytest.mark.parametrize("model_kind,extra", [("bc", PIPE), ("bi", dict(threshold=0.7, cache="dual"))])
def test_tpf_counts_rounds_and_every_round_is_one_forward(bc_model, bi_model, model_kind, extra):
    m = bc_model if model_kind == "bc" else bi_model
    calls = []
    handle = m.register_forward_hook(lambda *a: calls.append(1))
    spy = _Spy()
    try:
        out = _gen(m, _prompt(seed=6), strategy="lopa", lopa_branches=3, branch_executor=spy, **extra)
    finally:
        handle.remove()
    rounds = len(out.stats["lopa_winners"][0])
    assert int(out.num_forwards[0]) == rounds == out.stats["steps"] == len(spy.requests)
    assert len(calls) == rounds == out.stats["forwards"]  # one model call per round, all branches inside
    assert float(out.tpf[0]) == pytest.approx(int(out.generated_tokens[0]) / rounds)
    assert out.stats["lopa_branch_rows"] > rounds  # several branches per forward
    assert any(w > 0 for w in out.stats["lopa_winners"][0])  # lookaheads do win
    assert bool((out.step_map[0] >= 1).all()) and int(out.step_map[0].max()) == rounds


def test_lookahead_branches_are_anchor_plus_one_token(bc_model):
    spy = _Spy()
    ids, mask = _left_pad([_prompt(1, n, seed=n)[0].tolist() for n in (5, 8)])
    out = _gen(bc_model, ids, attention_mask=mask, strategy="lopa", lopa_branches=4, branch_executor=spy, **PIPE)
    k1, seen = 5, 0
    for req, res in zip(spy.requests, spy.results):
        S = req.x.shape[0]
        R = S // k1
        x = req.x.view(k1, R, -1)
        assert bool(req.valid[:R].all())  # the anchor of every row is verified
        for r in range(R):
            anchor = x[0, r]
            positions = []
            for j in range(1, k1):
                if not bool(req.valid[j * R + r]):
                    assert torch.equal(x[j, r], anchor)  # padding = the anchor
                    continue
                diff = (x[j, r] != anchor).nonzero().flatten().tolist()
                assert len(diff) == 1  # exactly one extra token
                pos = diff[0]
                assert int(anchor[pos]) == MASK and int(x[j, r, pos]) != MASK and pos >= req.start
                positions.append(pos)
                seen += 1
            assert len(set(positions)) == len(positions)  # distinct positions
        # scores of padding slots are -inf; compact results cover the window only
        assert bool(torch.isinf(res.score[~req.valid]).all())
        assert res.x0.shape == (S, req.width) and res.conf.shape == (S, req.width)
    assert seen > 0
    assert out.stats["lopa_commit_max_rel_diff"] == 0.0  # cached K/V bit-identical across branches


def test_commit_noop_check_fires_when_branch_caches_differ(bc_model):
    class Corrupt(_Spy):
        def __call__(self, model, **kw):
            inner = super().__call__(model, **kw)
            run = inner.run

            def bad(req):
                res = run(req)
                if res.digest is not None and res.digest.shape[0] > inner.rows:
                    res.digest[inner.rows:] += 1.0  # pretend a lookahead slot cached different K/V
                return res

            inner.run = bad
            return inner

    with pytest.raises(RuntimeError, match="invariant"):
        _gen(bc_model, _prompt(seed=6), strategy="lopa", lopa_branches=2, max_new_tokens=32, branch_executor=Corrupt(),
             **PIPE)


@pytest.mark.parametrize("model_kind,extra", [("bc", PIPE), ("bi", dict(threshold=0.7, cache="dual"))])
def test_greedy_determinism(bc_model, bi_model, model_kind, extra):
    m = bc_model if model_kind == "bc" else bi_model
    a = _gen(m, _prompt(seed=9), strategy="lopa", lopa_branches=4, **extra)
    b = _gen(m, _prompt(seed=9), strategy="lopa", lopa_branches=4, **extra)
    _same(a, b)
    assert a.stats["lopa_winners"] == b.stats["lopa_winners"]


@pytest.mark.parametrize("model_kind,extra", [("bc", PIPE), ("bi", dict(threshold=0.7, cache="dual"))])
@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_batch_rows_in_one_forward_equal_single_row_runs(bc_model, bi_model, model_kind, extra, stop_at_eos):
    m = bc_model if model_kind == "bc" else bi_model
    prompts = [_prompt(1, n, seed=n)[0].tolist() for n in (5, 9, 7)]
    ids, mask = _left_pad(prompts)
    kw = dict(strategy="lopa", lopa_branches=2, stop_at_eos=stop_at_eos, **extra)
    batch = _gen(m, ids, attention_mask=mask, **kw)
    L = ids.shape[1]
    for i, p in enumerate(prompts):
        single = _gen(m, torch.tensor([p]), **kw)
        assert torch.equal(batch.sequences[i, L:], single.sequences[0, len(p):]), i
        assert int(batch.num_forwards[i]) == int(single.num_forwards[0])
        assert batch.stats["lopa_winners"][i] == single.stats["lopa_winners"][0]
        assert batch.finish_reason[i] == single.finish_reason[0]


def test_score_variants_decode_to_completion(bc_model):
    for alpha, rho in [(0.5, 0.5), (0.0, 0.25), (1.0, 1.0)]:
        out = _gen(bc_model, _prompt(seed=2), strategy="lopa", lopa_branches=3, lopa_alpha=alpha, lopa_rho=rho, **PIPE)
        assert bool((out.sequences[0, 7:] != MASK).all())
        assert len(out.stats["lopa_winners"][0]) == int(out.num_forwards[0])


def test_eos_stops_rows_and_counts_tokens_up_to_eos(bc_model):
    p = _prompt(seed=6)
    out = _gen(bc_model, p, strategy="lopa", lopa_branches=2, stop_at_eos=True, max_new_tokens=32, **PIPE)
    ref = _gen(bc_model, p, strategy="lopa", lopa_branches=2, stop_at_eos=False, max_new_tokens=32, **PIPE)
    assert int(out.num_forwards[0]) <= int(ref.num_forwards[0])
    assert float(out.tpf[0]) == pytest.approx(int(out.generated_tokens[0]) / int(out.num_forwards[0]))


# ------------------------------------------------------------------------------- config
def test_config_fields_are_validated():
    with pytest.raises(GenerationConfigError, match="lopa_branches"):
        DiffusionGenerationConfig(strategy="lopa", lopa_branches=-1)
    with pytest.raises(GenerationConfigError, match="lopa_alpha"):
        DiffusionGenerationConfig(strategy="lopa", lopa_alpha=1.5)
    with pytest.raises(GenerationConfigError, match="lopa_rho"):
        DiffusionGenerationConfig(strategy="lopa", lopa_rho=0.0)
    cfg = DiffusionGenerationConfig(strategy="lopa", lopa_branches=4, lopa_alpha=0.5, lopa_rho=0.5, lopa_force_anchor=True)
    assert DiffusionGenerationConfig.from_dict(cfg.to_dict()) == cfg


def test_lopa_confidence_is_validated():
    with pytest.raises(GenerationConfigError, match="lopa_confidence.*valid: prob, neg_entropy"):
        DiffusionGenerationConfig(strategy="lopa", lopa_confidence="entropy")
    cfg = DiffusionGenerationConfig(strategy="lopa", lopa_branches=2, lopa_confidence="neg_entropy")
    assert DiffusionGenerationConfig.from_dict(cfg.to_dict()) == cfg


# ------------------------------------------------------------------------------- neg_entropy confidence
def test_neg_entropy_is_sum_p_log_p_and_handles_suppressed_tokens():
    logits = torch.randn(2, 5, 30, generator=torch.Generator().manual_seed(0))
    p = logits.double().softmax(-1)
    assert torch.allclose(neg_entropy(logits, temperature=0.0, top_p=None, top_k=None), (p * p.log()).sum(-1), atol=1e-5)
    logits[..., 3] = float("-inf")  # the runner suppresses [MASK] this way
    ne = neg_entropy(logits, temperature=0.0, top_p=None, top_k=None)
    assert bool(torch.isfinite(ne).all()) and bool((ne <= 0).all())
    sure = torch.full((1, 30), -30.0)
    sure[0, 7] = 30.0
    assert float(neg_entropy(sure, temperature=0.0, top_p=None, top_k=None)) == pytest.approx(0.0, abs=1e-6)
    # tempered and filtered as for sampling: top-k 1 leaves one token, a certain distribution
    assert float(neg_entropy(logits[:1, :1], temperature=0.7, top_p=None, top_k=1)) == pytest.approx(0.0, abs=1e-6)
    assert ne.dtype == torch.float64


def test_branch_scores_with_negative_entropy_treat_no_masks_as_certain():
    conf = torch.tensor([[-0.5, -1.5, -3.0], [-0.2, -0.2, -0.2]], dtype=torch.float64)
    m = torch.tensor([[True, True, False], [False, False, False]])
    s = branch_scores(conf, m, torch.zeros(2, dtype=torch.float64), 0.0, 1.0, certain=0.0)
    assert s.tolist() == [pytest.approx(-1.0), 0.0]


@pytest.mark.parametrize("model_kind,extra", [("bc", PIPE), ("bi", dict(threshold=0.7, cache="dual"))])
def test_neg_entropy_ranks_lookaheads_and_scores_branches(bc_model, bi_model, model_kind, extra):
    m = bc_model if model_kind == "bc" else bi_model
    spy = _Spy()
    out = _gen(m, _prompt(seed=6), strategy="lopa", lopa_branches=3, lopa_confidence="neg_entropy",
               branch_executor=spy, **extra)
    winners = out.stats["lopa_winners"][0]
    assert len(winners) == len(spy.requests) and any(w > 0 for w in winners)
    checked = 0
    for t, (req, res) in enumerate(zip(spy.requests, spy.results)):
        assert res.rank is not None and res.rank.shape == res.conf.shape and bool((res.rank <= 1e-9).all())
        # every verified branch is scored by the mean negative entropy of its remaining masks
        window = req.x[:, req.start: req.start + req.width]
        pos = torch.arange(req.start, req.start + req.width)
        scored = (window == MASK) & (pos[None] < req.slot_end[:, None])
        expect = branch_scores(res.rank, scored, req.creation, 0.0, 1.0, certain=0.0)
        assert torch.allclose(res.score[req.valid], expect[req.valid])
        assert float(req.creation[0]) == 0.0  # the anchor's creation confidence is the certain value
        if t == 0:
            continue
        # lookaheads of round t sit at the positions the previous winner ranked highest by negative entropy,
        # and carry that value as their creation confidence
        prev_req, prev_res, w = spy.requests[t - 1], spy.results[t - 1], winners[t - 1]
        rank = prev_res.rank[w]
        looks = [j for j in range(1, req.x.shape[0]) if bool(req.valid[j])]
        values = []
        for j in looks:
            p = int((req.x[j] != req.x[0]).nonzero().flatten()[0])
            values.append(float(rank[p - prev_req.start]))
            assert float(req.creation[j]) == pytest.approx(values[-1])
        assert values == sorted(values, reverse=True)
        checked += len(looks)
    assert checked > 0


@pytest.mark.parametrize("k", [0, 3])
def test_neg_entropy_keeps_the_k0_and_forced_anchor_invariants(bc_model, k):
    p = _prompt(seed=3)
    ref = _gen(bc_model, p, strategy="d2f", **PIPE)
    out = _gen(bc_model, p, strategy="lopa", lopa_branches=k, lopa_confidence="neg_entropy", lopa_force_anchor=k > 0,
               **PIPE)
    _same(ref, out)


def test_refresh_interval_is_rejected_on_bidirectional_models(bi_model):
    with pytest.raises(GenerationConfigError, match="refresh_interval"):
        _gen(bi_model, _prompt(), strategy="lopa", lopa_branches=2, cache="dual", refresh_interval=2)
