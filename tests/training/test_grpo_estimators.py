"""The three log-prob estimators against brute-force computations on tiny random models.

``trajectory`` must equal (a) log-probs recomputed step by step, one single-row forward per step on
the canvas "prompt + tokens committed before that step", and (b) the log-probs the decoder itself
saw at each of its forwards (captured with a hook), for threshold decoding on a bidirectional model
and for D2F (cached, pipelined) on a block-causal one.
"""

from __future__ import annotations

import pytest
import torch

from dllm.loading import load_model
from dllm.testing import save_tiny_checkpoint
from dllm.training.rl_objectives import (
    block_masked_views,
    d1_views,
    loss_mask,
    scatter_views,
    trajectory_views,
    view_logprobs,
)
from dllm.training.rollouts import generate_rollouts, stop_point

PROMPTS = ["What is 12 + 7 ?", "What is 3 * 45 ?", "What is 999 - 5 ?"]
TOL = 2e-5


class _Ex:
    def __init__(self, prompt):
        self.prompt, self.suite, self.answer, self.meta = prompt, "arith", "0", {"answer": 0}


@pytest.fixture(scope="module")
def bidir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bidir")
    _, tok = save_tiny_checkpoint(d, block_causal=False)
    return load_model(d), tok


@pytest.fixture(scope="module")
def blockc(tmp_path_factory):
    d = tmp_path_factory.mktemp("blockc")
    _, tok = save_tiny_checkpoint(d, block_causal=True, block_size=4)
    return load_model(d), tok


def _gen_cfg(model, tok, strategy, **kw):
    base = {"strategy": strategy, "max_new_tokens": 12, "block_length": 4, "temperature": 1.0, "threshold": 0.3,
            "skip_threshold": 0.3, "stop_at_eos": False, "mask_token_id": tok.mask_token_id,
            "eos_token_id": tok.eos_token_id, "return_dict_in_generate": True}
    base.update(kw)
    return model.diffusion_generation_config.replace(**base)


def _rollouts(model, tok, strategy, group=2, **kw):
    torch.set_num_threads(1)
    cfg = _gen_cfg(model, tok, strategy, **kw)
    ro = generate_rollouts(model, tok, [_Ex(p) for p in PROMPTS], group, cfg, batch_size=4, seed=3,
                           truncated_is_wrong=False)
    return ro, cfg


def _lp(model, views, ro, tok, **kw):
    lp = view_logprobs(model, views, ro.prompt_ids, ro.prompt_mask, ro.gen_ids, mask_id=tok.mask_token_id, **kw)
    return scatter_views(lp, views, len(ro))


def _single(model, prompt_row, prompt_mask_row, gen_canvas, **fw):
    """One forward of one row, its left padding stripped: logits of the generated region [G, V]."""
    prompt = prompt_row[prompt_mask_row.bool()]
    x = torch.cat([prompt, gen_canvas])[None]
    p = prompt.shape[0]
    logits = model(x, attention_mask=torch.ones_like(x), prompt_length=p, **fw).logits[0, p:].float()
    return logits


def _logp(logits, tokens, mask_id):
    logits = logits.clone()
    logits[..., mask_id] = float("-inf")
    return torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)


@pytest.mark.parametrize("which", ["bidir", "blockc"])
def test_trajectory_equals_step_by_step_recomputation(which, request):
    model, tok = request.getfixturevalue(which)
    ro, _ = _rollouts(model, tok, "threshold")
    mask = loss_mask(ro.lengths, ro.gen_ids.shape[1])
    views = trajectory_views(ro.gen_ids, ro.step_map, mask, tok.mask_token_id)
    bc = model.spec.block_size if model.is_block_causal else None
    got = _lp(model, views, ro, tok, block_causal_size=bc)
    m = tok.mask_token_id
    steps_seen = 0
    with torch.no_grad():
        for r in range(len(ro)):
            smap = ro.step_map[r]
            for s in range(1, int(smap.max()) + 1):
                now = (smap == s) & mask[r]
                if not bool(now.any()):
                    continue
                steps_seen += 1
                canvas = torch.where((smap >= 1) & (smap < s), ro.gen_ids[r], torch.full_like(ro.gen_ids[r], m))
                want = _logp(_single(model, ro.prompt_ids[r], ro.prompt_mask[r], canvas), ro.gen_ids[r], m)
                torch.testing.assert_close(got[r][now], want[now], atol=TOL, rtol=0)
    assert steps_seen == len(views)
    assert bool((got[mask] < 0).all()) and bool((got[~mask] == 0).all())
    # the views cover every loss token exactly once
    assert torch.equal(scatter_views(views.target.long(), views, len(ro)).bool(), mask)


def _capture(model):
    calls = []

    def hook(module, args, kwargs, output):
        calls.append({"input_ids": kwargs["input_ids"].clone(), "logits": output.logits.detach().float().clone(),
                      "logits_range": kwargs.get("logits_range"), "cache_start": kwargs.get("cache_start", 0),
                      "cache_mode": kwargs.get("cache_mode")})

    return calls, model.register_forward_hook(hook, with_kwargs=True)


def _eos_bias(model, eos, bias):
    """Make EOS likely (a hook adding ``bias`` to its logit) so rollouts stop early and commit post-EOS tokens."""
    return model.register_forward_hook(lambda mod, a, out: out.logits.__setitem__((..., eos), out.logits[..., eos] + bias))


@pytest.mark.parametrize("which,strategy,bias", [("bidir", "threshold", 0.0), ("bidir", "threshold", 9.0),
                                                 ("blockc", "threshold", 0.0), ("blockc", "d2f", 0.0),
                                                 ("blockc", "d2f", 9.0)])
def test_trajectory_replays_the_decoders_own_forwards(which, strategy, bias, request):
    """Single-row decodes: forward k of the decoder is step k of the row; the canvas it saw (no cache)
    and the log-probs it sampled from must be what the trajectory estimator rebuilds."""
    model, tok = request.getfixturevalue(which)
    bias_handle = _eos_bias(model, tok.eos_token_id, bias) if bias else None
    try:
        _replay_check(model, tok, strategy, expect_eos=bool(bias))
    finally:
        if bias_handle is not None:
            bias_handle.remove()


def _replay_check(model, tok, strategy, expect_eos):
    m = tok.mask_token_id
    torch.set_num_threads(1)
    from dllm.text import left_pad
    from dllm.training.data import encode_prompt

    cfg = _gen_cfg(model, tok, strategy)
    checked, short = 0, 0
    for i, prompt in enumerate(PROMPTS):
        ids, am = left_pad([encode_prompt(tok, prompt)], tok.pad_token_id)
        calls, handle = _capture(model)
        try:
            out = model.generate(ids, attention_mask=am, generation_config=cfg.replace(seed=11 + i))
        finally:
            handle.remove()
        p = ids.shape[1]
        gen, smap = out.sequences[0, p:], out.step_map[0]
        assert len(calls) == int(out.num_forwards[0]) == int(smap.max())
        lengths, _ = stop_point(gen[None], smap[None], out.num_forwards, tok.eos_token_id)
        mask = loss_mask(lengths, gen.shape[0])
        short += int(lengths[0] < gen.shape[0])
        views = trajectory_views(gen[None], smap[None], mask, m)
        fw = {"block_size": cfg.block_length} if strategy == "d2f" else {}
        bc = (cfg.block_length if strategy == "d2f" else model.spec.block_size) if model.is_block_causal else None
        got = scatter_views(view_logprobs(model, views, ids, am, gen[None], mask_id=m, block_causal_size=bc,
                                          forward_kwargs=fw), views, 1)[0]
        for k, call in enumerate(calls, start=1):
            now = (smap == k) & mask[0]
            if not bool(now.any()):
                continue
            a = call["logits_range"][0] if call["logits_range"] else 0
            first_slot = call["cache_start"] + a  # canvas slot of the first logit row
            slots = torch.nonzero(now).flatten() + p - first_slot
            want = _logp(call["logits"][0, slots], gen[now], m)
            torch.testing.assert_close(got[now], want, atol=TOL, rtol=0)
            if call["cache_mode"] is None:  # full forward: the replayed canvas is the decoder's canvas
                v = int(torch.nonzero(views.target[:, now.nonzero()[0, 0]]).flatten()[0])
                assert torch.equal(call["input_ids"][0, p:], views.gen[v])
            checked += 1
    assert checked > 3
    assert short >= (2 if expect_eos else 0)


@pytest.mark.parametrize("which", ["bidir", "blockc"])
def test_block_masked_equals_brute_force(which, request):
    model, tok = request.getfixturevalue(which)
    ro, _ = _rollouts(model, tok, "threshold")
    m, block = tok.mask_token_id, 4
    mask = loss_mask(ro.lengths, ro.gen_ids.shape[1])
    views = block_masked_views(ro.gen_ids, mask, block, m)
    bc = model.spec.block_size if model.is_block_causal else None
    got = _lp(model, views, ro, tok, block_causal_size=bc)
    g = ro.gen_ids.shape[1]
    with torch.no_grad():
        for r in range(len(ro)):
            for j in range(int(ro.lengths[r])):
                b0 = (j // block) * block
                canvas = ro.gen_ids[r].clone()
                canvas[b0:] = m  # this token's whole block and everything after it masked, earlier blocks clean
                want = _logp(_single(model, ro.prompt_ids[r], ro.prompt_mask[r], canvas), ro.gen_ids[r], m)[j]
                torch.testing.assert_close(got[r, j], want, atol=TOL, rtol=0)
    assert len(views) == sum(-(-int(length) // block) for length in ro.lengths) and g == 12


@pytest.mark.parametrize("which", ["bidir", "blockc"])
def test_d1_equals_brute_force(which, request):
    model, tok = request.getfixturevalue(which)
    ro, _ = _rollouts(model, tok, "threshold")
    m = tok.mask_token_id
    mask = loss_mask(ro.lengths, ro.gen_ids.shape[1])
    views = d1_views(ro.gen_ids, mask, m, ro.prompt_mask, 0.3, torch.Generator().manual_seed(0))
    assert len(views) == len(ro)
    assert not bool((views.prompt_noise & ~ro.prompt_mask.bool()[views.row]).any())  # padding never "masked"
    got = _lp(model, views, ro, tok)
    with torch.no_grad():
        for v in range(len(views)):
            r = int(views.row[v])
            prompt = torch.where(views.prompt_noise[v], torch.full_like(ro.prompt_ids[r], m), ro.prompt_ids[r])
            canvas = torch.full_like(ro.gen_ids[r], m)
            want = _logp(_single(model, prompt, ro.prompt_mask[r], canvas), ro.gen_ids[r], m)
            torch.testing.assert_close(got[r][mask[r]], want[mask[r]], atol=TOL, rtol=0)


def test_d1_prompt_mask_rate():
    valid = torch.ones(200, 50, dtype=torch.long)
    valid[:, :10] = 0
    gen = torch.zeros(200, 4, dtype=torch.long)
    v = d1_views(gen, torch.ones(200, 4, dtype=torch.bool), 9, valid, 0.15, torch.Generator().manual_seed(1))
    rate = float(v.prompt_noise[:, 10:].double().mean())
    assert abs(rate - 0.15) < 0.01 and not bool(v.prompt_noise[:, :10].any())
    assert bool((v.gen == 9).all())


def test_stop_point_and_exact_canvas_tpf(bidir):
    """exact_canvas (stop_at_eos=False) reports the same TPF as a decoder that stops at EOS."""
    model, tok = bidir
    eos = tok.eos_token_id
    handle = _eos_bias(model, eos, 9.0)
    try:
        found_eos = 0
        for i, prompt in enumerate(PROMPTS * 2):
            from dllm.text import left_pad
            from dllm.training.data import encode_prompt

            ids, am = left_pad([encode_prompt(tok, prompt)], tok.pad_token_id)
            cfg = _gen_cfg(model, tok, "threshold", max_new_tokens=16, seed=100 + i)
            a = model.generate(ids, attention_mask=am, generation_config=cfg.replace(stop_at_eos=True))
            b = model.generate(ids, attention_mask=am, generation_config=cfg)
            la, fa = stop_point(a.sequences[:, ids.shape[1]:], a.step_map, a.num_forwards, eos)
            lb, fb = stop_point(b.sequences[:, ids.shape[1]:], b.step_map, b.num_forwards, eos)
            assert int(la) == int(lb) == int(a.generated_tokens[0])
            assert int(fa) == int(fb) == int(a.num_forwards[0])
            found_eos += int((a.sequences == eos).any())
        assert found_eos >= 2
    finally:
        handle.remove()


def test_stop_point_by_hand():
    gen = torch.tensor([[5, 6, 2, 7], [5, 6, 7, 8], [2, 2, 2, 2]])
    smap = torch.tensor([[1, 3, 2, 1], [1, 2, 2, 3], [4, 1, 2, 3]])
    lengths, forwards = stop_point(gen, smap, torch.tensor([5, 3, 4]), eos_id=2)
    assert lengths.tolist() == [3, 4, 1]
    assert forwards.tolist() == [3, 3, 4]


def test_stop_point_stops_at_any_of_several_eos_ids():
    gen = torch.tensor([[5, 6, 9, 7], [5, 2, 7, 8], [5, 6, 7, 8]])
    smap = torch.tensor([[1, 3, 2, 1], [1, 2, 2, 3], [4, 1, 2, 3]])
    lengths, forwards = stop_point(gen, smap, torch.tensor([5, 3, 4]), eos_id=(2, 9))
    assert lengths.tolist() == [3, 2, 4]
    assert forwards.tolist() == [3, 2, 4]
