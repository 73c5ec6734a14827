"""The families' own decoders against their references (tests/fixtures/{sdar,fast_dllm_v2}/README.md):
``sdar`` = SDAR's ``block_diffusion_generate``, ``fast_dllm_v2`` = Fast-dLLM v2's ``batch_sample``, on the
tiny checkpoints at temperature 0 in float32: the same tokens and the forward counts the READMEs state.
Then what holds for any batch: a row decodes as it does alone, and the strategies that need a
position-aligned or shifted model refuse the others with a reason."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import pytest
import torch

from dllm import DiffusionGenerationConfig
from dllm.decoding.errors import GenerationConfigError, StrategyError
from dllm.testing import tiny_block_model, tiny_llada

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _sha(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


@cache
def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name / "generate.json").read_text())


@cache
def _model(name: str):
    entry = _fixture(name)["model"]
    r = entry["recipe"]
    model = tiny_block_model(r["family"], seed=r["seed"], scale=r["scale"], silent=tuple(r["silent"]))
    if _sha(model) != entry["sha256"]:
        pytest.fail(f"the {name} checkpoint is not the one the reference ran on; see tests/fixtures/{name}/README.md")
    return model


def _ids(n):
    return range(n)


def _run(model, prompt, **options):
    cfg = DiffusionGenerationConfig(temperature=0.0, stop_at_eos=False, suppress_mask_token=False, mask_token_id=3,
                                    eos_token_id=2, return_dict_in_generate=True, **options)
    out = model.generate(torch.tensor([prompt]), generation_config=cfg)
    return out.sequences[0, len(prompt):].tolist(), int(out.num_forwards[0])


@pytest.mark.parametrize("case", _ids(len(_fixture("sdar")["cases"])))
def test_sdar_matches_block_diffusion_generate(case):
    c = _fixture("sdar")["cases"][case]
    o = c["options"]
    tokens, forwards = _run(_model("sdar"), c["prompt"], strategy="sdar", max_new_tokens=len(c["generated"]),
                            block_length=o["block_length"], denoising_steps=o["denoising_steps"],
                            unmasking=o["remasking_strategy"], threshold=o["confidence_threshold"])
    assert tokens == c["generated"]
    assert forwards == c["denoising_forwards"]  # its store/prefill forwards are folded into dllm's next one


@pytest.mark.parametrize("case", _ids(len(_fixture("fast_dllm_v2")["cases"])))
def test_fast_dllm_v2_matches_batch_sample(case):
    c = _fixture("fast_dllm_v2")["cases"][case]
    o = c["options"]
    block = _model("fast_dllm_v2").spec.block_size
    n = len(c["prompt"])
    tokens, forwards = _run(_model("fast_dllm_v2"), c["prompt"], strategy="fast_dllm_v2",
                            max_new_tokens=len(c["generated"]), block_length=block,
                            sub_block_length=o["small_block_size"], threshold=o["threshold"],
                            cache="dual" if o["use_block_cache"] else "none")
    assert tokens == c["generated"]
    # the reference's prefill of a prompt's complete blocks commits nothing: dllm folds it in
    assert forwards == c["forwards"] - (1 if n > block and n % block else 0)


def _padded(prompts):
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


@pytest.mark.parametrize("name,strategy,extra", [("sdar", "sdar", {}), ("fast_dllm_v2", "fast_dllm_v2", {}),
                                                 ("fast_dllm_v2", "fast_dllm_v2", {"sub_block_length": 4}),
                                                 ("fast_dllm_v2", "fast_dllm_v2", {"cache": "dual"}),
                                                 ("fast_dllm_v2", "fast_dllm_v2", {"cache": "dual",
                                                                                   "sub_block_length": 2}),
                                                 ("sdar", "d2f", {}), ("fast_dllm_v2", "threshold", {}),
                                                 ("sdar", "lopa", {"lopa_branches": 2})])
def test_a_row_decodes_in_a_batch_as_alone(name, strategy, extra):
    """Rows of different prompt lengths sit on different block grids (SDAR/Fast-dLLM v2 decoders) or on the
    grid anchored at the prompt end (the other strategies); either way a row is independent of its batch."""
    model = _model(name)
    prompts = [[81, 296, 353], [279, 103, 131, 341, 241, 7, 9], list(range(20, 36))]
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=10, block_length=model.spec.block_size,
                                    temperature=0.0, stop_at_eos=False, mask_token_id=3, eos_token_id=2,
                                    return_dict_in_generate=True, **extra)
    ids, mask = _padded(prompts)
    batch = model.generate(ids, attention_mask=mask, generation_config=cfg)
    for i, p in enumerate(prompts):
        alone = model.generate(torch.tensor([p]), generation_config=cfg)
        assert batch.sequences[i, ids.shape[1]:].tolist() == alone.sequences[0, len(p):].tolist()
        assert int(batch.num_forwards[i]) == int(alone.num_forwards[0])


def test_strategies_refuse_models_they_cannot_decode():
    sdar, fast = _model("sdar"), _model("fast_dllm_v2")
    x = torch.tensor([[5, 6, 7]])
    with pytest.raises(StrategyError, match="shifted logits"):
        sdar.generate(x, strategy="fast_dllm_v2", max_new_tokens=4, block_length=4)
    d2f_student = tiny_llada(attention_policy="block_causal", block_size=4)
    with pytest.raises(StrategyError, match="counted from position 0"):
        d2f_student.generate(x, strategy="sdar", max_new_tokens=4, block_length=4)
    with pytest.raises(StrategyError, match="needs a block-causal model"):
        tiny_llada().generate(x, strategy="sdar", max_new_tokens=4)
    with pytest.raises(GenerationConfigError, match="cache='dual' reuses"):
        fast.generate(x, strategy="fast_dllm_v2", max_new_tokens=8, block_length=8, cache="prefix")
    with pytest.raises(GenerationConfigError, match="must divide the block length"):
        fast.generate(x, strategy="fast_dllm_v2", max_new_tokens=8, block_length=8, sub_block_length=3)
    with pytest.raises(GenerationConfigError, match="unmasking="):
        DiffusionGenerationConfig(strategy="sdar", unmasking="sequential")


def test_sampling_is_seeded_and_eos_stops_a_row():
    model = _model("sdar")
    kw = dict(strategy="sdar", max_new_tokens=12, block_length=4, temperature=1.0, top_k=50, top_p=0.9, seed=7,
              mask_token_id=3, eos_token_id=2)
    a = model.generate(torch.tensor([[5, 6, 7, 8, 9]]), **kw)
    b = model.generate(torch.tensor([[5, 6, 7, 8, 9]]), **kw)
    assert a.tolist() == b.tolist()
    # EOS: take the first token the model commits as the EOS id; the row then stops as soon as that
    # slot and everything before it is committed, and the rest of the answer is EOS
    greedy = {**kw, "temperature": 0.0, "return_dict_in_generate": True, "stop_at_eos": False}
    free = model.generate(torch.tensor([[5, 6, 7, 8, 9]]), **greedy)
    first = int(free.sequences[0, 5])
    out = model.generate(torch.tensor([[5, 6, 7, 8, 9]]), **{**greedy, "eos_token_id": first, "stop_at_eos": True})
    assert out.finish_reason == ["stop"] and out.sequences[0, 5:].tolist() == [first] * 12
    assert int(out.num_forwards[0]) < int(free.num_forwards[0])
