"""Parity with the reference decoders, on tokens they computed (tests/fixtures/parity/).

The fixtures hold the outputs of the published decoding code, run unmodified on tiny checkpoints at
temperature 0 in float32 (tests/fixtures/parity/README.md says which upstream commit and which
adapter produced each file). Here dllm decodes the same prompts with the same weights and must
give the same tokens and the same number of forwards (LoPA: rounds).

Conventions of the comparison:

* dllm runs with ``suppress_mask_token=False`` and ``stop_at_eos=False`` (the references may
  commit ``[MASK]`` and decode past an EOS); a slot the reference left as ``[MASK]`` is the EOS
  fill in dllm's ``sequences``.
* The D2F and LoPA checkpoints have a zero LM-head row for ``[MASK]``, so neither side ever
  predicts it: the references count a committed ``[MASK]`` as a decoded token in their block
  bookkeeping, dllm reads the canvas.
* D2F and LoPA grow their canvas one block at a time: dllm's slots past the reference's last
  block are never committed.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import pytest
import torch

from dllm import load_model
from dllm.testing import tiny_dream, tiny_llada

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "parity"
RANKING = {"default": "prob", "neg_entropy": "neg_entropy", "margin_confidence": "margin", "margin": "margin"}


def _load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def weights_sha256(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def build_model(entry: dict, block_size: int | None = None):
    """The fixture's checkpoint, viewed block-causally with ``block_size`` when given."""
    recipe = entry["recipe"]
    view = {} if block_size is None else {"attention_policy": "block_causal", "block_size": block_size}
    if "bundled" in recipe:
        model = load_model(recipe["bundled"], **view)
    else:
        builder = {"tiny_llada": tiny_llada, "tiny_dream": tiny_dream}[recipe["builder"]]
        model = builder(seed=recipe["seed"], initializer_range=recipe["initializer_range"], **view)
        row = recipe.get("zero_lm_head_row")
        if row is not None:
            key = "model.transformer.ff_out.weight" if recipe["builder"] == "tiny_llada" else "lm_head.weight"
            with torch.no_grad():
                model.state_dict()[key][row] = 0.0
    if weights_sha256(model) != entry["sha256"]:
        pytest.fail(f"the weights of {recipe} are not those the reference outputs were computed with; "
                    "recompute the fixtures (tests/fixtures/parity/README.md)")
    return model


@cache
def _model(fixture: str, name: str, block_size: int | None):
    return build_model(_load(fixture)["models"][name], block_size)


def _filled(ref: list, mask_id: int, eos_id: int) -> torch.Tensor:
    """The reference's tokens as dllm writes them: a slot never filled holds the EOS fill."""
    t = torch.tensor(ref)
    return torch.where(t == mask_id, torch.full_like(t, eos_id), t)


# ----------------------------------------------------------------------------- Fast-dLLM
FAST = _load("fast_dllm.json")


def _fast_id(c: dict) -> str:
    rule = c["strategy"] + (f"{c['threshold']}" if "threshold" in c else f"{c.get('factor', '')}")
    bound = "-bound" if c["dual_cache_step_bound"] else ""
    return f"{c['cache']}{bound}-{rule}-G{c['gen_length']}B{c['block_length']}T{c['steps']}-{c['prompt'][0]}"


@pytest.mark.parametrize("case", FAST["cases"], ids=_fast_id)
def test_fast_dllm_tokens_and_forwards(case):
    """All strategy x cache combinations of upstream ``v1/llada/generate.py``.

    Upstream runs threshold/factor with the dual cache at ``steps = gen_length``; its loop bound
    ``range(1, steps_per_block)`` is ``dual_cache_step_bound=True`` here, with ``steps = G/B`` and
    ``2G/B``: blocks stay partly masked and the next block-start refresh may fill them.
    """
    entry = FAST["models"][FAST["model"]]
    model = _model("fast_dllm.json", FAST["model"], None)
    kw = {k: case[k] for k in ("threshold", "factor") if k in case}
    steps = case["steps"] if (case["strategy"] == "vanilla" or case["dual_cache_step_bound"]) else None
    prompt = torch.tensor([case["prompt"]])
    out = model.generate(prompt, strategy=case["strategy"], cache=case["cache"], steps=steps,
                         max_new_tokens=case["gen_length"], block_length=case["block_length"],
                         dual_cache_step_bound=case["dual_cache_step_bound"], stop_at_eos=False,
                         suppress_mask_token=False, return_dict_in_generate=True, **kw)
    ref = _filled(case["generated"], entry["mask_token_id"], entry["eos_token_id"])
    assert out.sequences[0, prompt.shape[1]:].tolist() == ref.tolist()
    assert int(out.num_forwards[0]) == case["nfe"]


# ----------------------------------------------------------------------------- LLaDA generate.py
LLADA = _load("llada_generate.json")


@pytest.mark.parametrize("case", LLADA["cases"],
                         ids=lambda c: f"G{c['gen_length']}B{c['block_length']}T{c['steps']}cfg{c['cfg_scale']}")
def test_llada_vanilla_tokens_and_forwards(case):
    """``vanilla`` (and classifier-free guidance) against ML-GSAI/LLaDA ``generate``, batch of 2."""
    entry = LLADA["models"][LLADA["model"]]
    model = _model("llada_generate.json", LLADA["model"], None)
    prompt = torch.tensor(case["prompts"])
    out = model.generate(prompt, strategy="vanilla", steps=case["steps"], max_new_tokens=case["gen_length"],
                         block_length=case["block_length"], cfg_scale=case["cfg_scale"], stop_at_eos=False,
                         suppress_mask_token=False, return_dict_in_generate=True)
    ref = _filled(case["generated"], entry["mask_token_id"], entry["eos_token_id"])
    assert out.sequences[:, prompt.shape[1]:].tolist() == ref.tolist()
    assert out.num_forwards.tolist() == [case["forwards"]] * prompt.shape[0]


# ----------------------------------------------------------------------------- D2F-eval and LoPA
D2F = _load("d2f_eval.json")
LOPA = _load("lopa.json")


def _pipeline_kwargs(case: dict, entry: dict, eos_id: int) -> dict:
    return dict(max_new_tokens=case["max_new_tokens"], block_length=case["block_size"],
                block_add_threshold=case["block_add_threshold"], decoded_token_threshold=case["decoded_token_threshold"],
                skip_threshold=case["skip_threshold"], d2f_confidence=RANKING[case["sampling_strategy"]],
                suppress_mask_token=False, stop_at_eos=False, mask_token_id=entry["mask_token_id"], eos_token_id=eos_id,
                return_dict_in_generate=True)


def _d2f_eos(case: dict, entry: dict) -> int:
    # D2F-eval's LLaDA path tests EOS against LLaDA-8B's id 126081, which no tiny checkpoint emits:
    # no EOS ever stops its block appending, so dllm gets an EOS id the model never predicts.
    return D2F["eos_token_id_llada_path"] if case["path"] == "llada" else entry["eos_token_id"]


def _lopa_kwargs(case: dict) -> dict:
    # branching_factor b = b lookahead branches + the anchor, except b = 1 (plain D2F)
    b = case["branching_factor"]
    return dict(strategy="lopa", lopa_branches=0 if b == 1 else b, lopa_confidence=RANKING[case["sampling_strategy"]],
                lopa_alpha=case["selection_conf_alpha"], lopa_rho=case["branch_topp"])


def _check_row(out, row: int, prompt_len: int, case: dict, forwards: int) -> None:
    gen = out.sequences[row, prompt_len:]
    n = len(case["generated"])
    assert gen[:n].tolist() == case["generated"]
    assert bool((out.step_map[row, n:] == -1).all())  # blocks the reference never appended
    assert int(out.num_forwards[row]) == forwards


def _d2f_id(c: dict) -> str:
    return (f"{c['path']}-{c['model']}-B{c['block_size']}-{c['block_add_threshold']}/{c['decoded_token_threshold']}/"
            f"{c['skip_threshold']}-{c['sampling_strategy']}-{c['prompt'][1]}")


@pytest.mark.parametrize("case", D2F["cases"], ids=_d2f_id)
def test_d2f_tokens_and_forwards(case):
    """``d2f`` against D2F-eval's Dream and LLaDA paths; ``sampling_strategy`` is ``d2f_confidence``."""
    entry = D2F["models"][case["model"]]
    model = _model("d2f_eval.json", case["model"], case["block_size"])
    prompt = torch.tensor([case["prompt"]])
    out = model.generate(prompt, strategy="d2f", **_pipeline_kwargs(case, entry, _d2f_eos(case, entry)))
    _check_row(out, 0, prompt.shape[1], case, case["forwards"])


def _lopa_id(c: dict) -> str:
    return (f"{c['model']}-b{c['branching_factor']}-{c['sampling_strategy']}-a{c['selection_conf_alpha']}-"
            f"{c['block_add_threshold']}/{c['decoded_token_threshold']}/{c['skip_threshold']}-{c['prompt'][1]}")


@pytest.mark.parametrize("case", LOPA["cases"], ids=_lopa_id)
def test_lopa_tokens_and_rounds(case):
    """``lopa`` on a block-causal Dream model against ``scale_dream_d2f`` (block-causal attention).

    The reference's one ``sampling_strategy`` is ``d2f_confidence`` (the anchor's top-1 fallback)
    and ``lopa_confidence`` (branch scores, lookahead positions) together. Its round count
    (``steps_completed``) also counts the final round in which the winner is found finished
    without a forward.
    """
    entry = LOPA["models"][case["model"]]
    model = _model("lopa.json", case["model"], case["block_size"])
    prompt = torch.tensor([case["prompt"]])
    out = model.generate(prompt, **_pipeline_kwargs(case, entry, entry["eos_token_id"]), **_lopa_kwargs(case))
    _check_row(out, 0, prompt.shape[1], case, case["steps_completed"] - 1)


def _groups(cases: list, keys: tuple) -> list:
    """Cases that differ only in their (equal-length) prompt: one batched call each."""
    groups: dict = {}
    for c in cases:
        groups.setdefault(tuple(json.dumps(c[k]) for k in keys) + (len(c["prompt"]),), []).append(c)
    return [g for g in groups.values() if len(g) > 1]


D2F_KEYS = ("path", "model", "block_size", "max_new_tokens", "block_add_threshold", "decoded_token_threshold",
            "skip_threshold", "sampling_strategy")
LOPA_KEYS = D2F_KEYS[1:] + ("branching_factor", "selection_conf_alpha", "branch_topp")


@pytest.mark.parametrize("group", _groups(D2F["cases"], D2F_KEYS)[::3], ids=lambda g: _d2f_id(g[0]))
def test_d2f_batched_rows_match_the_reference(group):
    """The reference decodes one prompt at a time; a batch gives every row its reference tokens."""
    case = group[0]
    entry = D2F["models"][case["model"]]
    model = _model("d2f_eval.json", case["model"], case["block_size"])
    prompt = torch.tensor([c["prompt"] for c in group])
    out = model.generate(prompt, strategy="d2f", **_pipeline_kwargs(case, entry, _d2f_eos(case, entry)))
    for r, c in enumerate(group):
        _check_row(out, r, prompt.shape[1], c, c["forwards"])


@pytest.mark.parametrize("group", _groups(LOPA["cases"], LOPA_KEYS)[::3], ids=lambda g: _lopa_id(g[0]))
def test_lopa_batched_rows_match_the_reference(group):
    case = group[0]
    entry = LOPA["models"][case["model"]]
    model = _model("lopa.json", case["model"], case["block_size"])
    prompt = torch.tensor([c["prompt"] for c in group])
    out = model.generate(prompt, **_pipeline_kwargs(case, entry, entry["eos_token_id"]), **_lopa_kwargs(case))
    for r, c in enumerate(group):
        _check_row(out, r, prompt.shape[1], c, c["steps_completed"] - 1)


def _differs(test, case, **override) -> bool:
    original = globals()["_pipeline_kwargs"]

    def patched(c, entry, eos):
        return {**original(c, entry, eos), **override}

    globals()["_pipeline_kwargs"] = patched
    try:
        test(case)
    except AssertionError:
        return True
    finally:
        globals()["_pipeline_kwargs"] = original
    return False


@pytest.mark.parametrize("fixture,test,expected", [(D2F, test_d2f_tokens_and_forwards, 24),
                                                   (LOPA, test_lopa_tokens_and_rounds, 26)], ids=["d2f", "lopa"])
def test_the_fallback_ranking_matters_on_the_fixtures(fixture, test, expected):
    """The fixtures tell the rankings apart: with the top-1 fallback ranked by probability (dllm
    before ``d2f_confidence`` existed) this many ``neg_entropy`` cases differ (docs/decoding.md)."""
    cases = [c for c in fixture["cases"] if c["sampling_strategy"] == "neg_entropy"]
    assert sum(_differs(test, c, d2f_confidence="prob") for c in cases) == expected


def test_fixtures_cover_the_reference_options():
    """The coverage the fixtures promise (README): every ranking, cache and step-bound mode."""
    fast = {(c["cache"], c["strategy"], c["dual_cache_step_bound"]) for c in FAST["cases"]}
    assert {(cache, s, False) for cache in ("none", "prefix", "dual") for s in ("vanilla", "threshold", "factor")} <= fast
    assert {("dual", "threshold", True), ("dual", "factor", True)} <= fast
    assert {(c["path"], c["sampling_strategy"]) for c in D2F["cases"]} == {
        (p, s) for p in ("dream", "llada") for s in ("default", "neg_entropy", "margin_confidence")}
    assert {(c["branching_factor"], c["sampling_strategy"]) for c in LOPA["cases"]} >= {
        (b, s) for b in (1, 2, 3) for s in ("default", "neg_entropy", "margin")}
    assert any(c["cfg_scale"] > 0 for c in LLADA["cases"])
