"""Token editing (strategy ``edit``): LLaDA2.1 reference parity, equality with ``threshold`` when T2T is
off, streaming of final blocks only, and the edit statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dllm
from dllm import DiffusionGenerationConfig, GenerationConfigError, load_model, load_tokenizer
from dllm.decoding.errors import StrategyError
from dllm.decoding.streaming import CollectingBatchStreamer
from dllm.text import generate_text, left_pad

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "moe" / "llada21_generate.json"
CASES = json.loads(FIXTURE.read_text())["cases"]
EOS = 2


def _cfg(case: dict, **extra) -> DiffusionGenerationConfig:
    fields = dict(strategy="edit", block_length=case["block_length"], max_new_tokens=case["gen_length"],
                  threshold=case["threshold"], editing_threshold=case["editing_threshold"],
                  max_post_steps=case["max_post_steps"], stop_at_eos=False, suppress_mask_token=False,
                  return_dict_in_generate=True)
    return DiffusionGenerationConfig(**{**fields, **extra})


def _forwards_match(case: dict, forwards: int) -> bool:
    if case["editing_threshold"] < 1:
        return forwards == case["forwards"]
    # editing_threshold 1 cannot edit: dllm skips the reference's one look for an edit per block, and (its
    # tokens being final at once) ends the row when its max_new_tokens slots are filled, as `threshold` does
    return forwards < case["forwards"]


@pytest.fixture(scope="module")
def llada2(moe_checkpoints):
    return load_model(moe_checkpoints["llada2"])


def test_reference_parity_one_prompt_at_a_time(llada2):
    """LLaDA2.1's generate (blocks from position 0, M2T + T2T, post steps): same tokens, same forwards."""
    assert len(CASES) == 36 and any(c["forwards"] > 2 * c["gen_length"] for c in CASES)  # edits do fire
    for case in CASES:
        out = llada2.generate(torch.tensor([case["prompt"]]), generation_config=_cfg(case))
        gen = out.sequences[0, len(case["prompt"]):].tolist()
        assert gen == case["generated"], case
        assert _forwards_match(case, int(out.num_forwards[0])), case


def test_llada20_generate_is_edit_without_t2t(llada2):
    """LLaDA2.0's generate (one token or all above the threshold per step, no editing) is ``edit`` with
    ``editing_threshold=1``: same tokens; same forwards where the canvas ends on a block boundary (elsewhere
    dllm ends the row once its ``max_new_tokens`` slots are filled, where the reference fills its last block)."""
    cases = json.loads((FIXTURE.parent / "llada20_generate.json").read_text())["cases"]
    for case in cases:
        cfg = _cfg({**case, "editing_threshold": 1.0, "max_post_steps": 16})
        out = llada2.generate(torch.tensor([case["prompt"]]), generation_config=cfg)
        assert out.sequences[0, len(case["prompt"]):].tolist() == case["generated"], case
        forwards = int(out.num_forwards[0])
        aligned = (len(case["prompt"]) + case["gen_length"]) % case["block_length"] == 0
        assert forwards == case["forwards"] if aligned else forwards <= case["forwards"], case


def test_reference_parity_batched_rows_keep_their_own_grids(llada2):
    """Prompts of 5, 8 and 13 tokens in one call: each row's blocks start at its own first token, each
    row advances through its blocks on its own, and gets the tokens and forwards of its solo run."""
    groups: dict[tuple, list] = {}
    for c in CASES:
        groups.setdefault((c["block_length"], c["threshold"], c["editing_threshold"], c["max_post_steps"]), []).append(c)
    for cases in groups.values():
        ids, mask = left_pad([c["prompt"] for c in cases], 0)
        out = llada2.generate(ids, attention_mask=mask, generation_config=_cfg(cases[0]))
        for i, c in enumerate(cases):
            gen = out.sequences[i, ids.shape[1]:].tolist()
            ref = c["generated"]
            # up to the first EOS: past it dllm's canvas may end a row early ("length") and fill with EOS
            cut = ref.index(EOS) + 1 if EOS in ref else len(ref)
            assert gen[:cut] == ref[:cut], c
            assert _forwards_match(c, int(out.num_forwards[i])), c


@pytest.fixture(scope="module")
def d2f():
    return load_model("tiny-d2f"), load_tokenizer("tiny-d2f")


PROMPTS = ["reverse : Ann Bob Cal Dan", "what is 12 + 7 ?", "sort : 5 2 9 1 7", "count : a b c d e f"]


@pytest.mark.parametrize("threshold", [0.9, 0.6, 0.3])
def test_edit_without_t2t_equals_threshold(d2f, threshold):
    model, tok = d2f
    base = model.diffusion_generation_config.replace(threshold=threshold)
    a = generate_text(model, tok, PROMPTS, generation_config=base.replace(strategy="threshold"))
    for post in (0, 16):  # with editing_threshold 1 the post steps are skipped: they could not edit
        b = generate_text(model, tok, PROMPTS, generation_config=base.replace(
            strategy="edit", editing_threshold=1.0, max_post_steps=post))
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        assert [r.num_forwards for r in a] == [r.num_forwards for r in b]


def test_edits_are_counted_and_tpf_counts_net_tokens(llada2):
    case = max(CASES, key=lambda c: c["forwards"])
    out = llada2.generate(torch.tensor([case["prompt"]]), generation_config=_cfg(case))
    assert out.stats["edits"][0] > 0 and out.stats["edit_forwards"][0] > 0
    assert out.stats["blocks"][0] == 3
    assert float(out.tpf[0]) == pytest.approx(int(out.generated_tokens[0]) / int(out.num_forwards[0]))


class Recorder:
    """A transformers-style streamer that keeps every chunk."""

    def __init__(self):
        self.chunks = []

    def put(self, ids):
        self.chunks.append(ids.tolist())

    def end(self):
        pass


def test_streaming_sends_only_final_blocks(llada2):
    """Edits rewrite committed tokens of the current block; the streamer must see a block once, final."""
    case = next(c for c in CASES if c["editing_threshold"] < 0.5 and c["block_length"] == 4 and len(c["prompt"]) == 8)
    rec = Recorder()
    out = llada2.generate(torch.tensor([case["prompt"]]), generation_config=_cfg(case, stop_at_eos=True),
                          streamer=rec)
    streamed = [t for chunk in rec.chunks[1:] for t in chunk]  # chunk 0 is the prompt
    answer = out.sequences[0, len(case["prompt"]):].tolist()
    answer = answer[: answer.index(EOS)] if EOS in answer else answer
    assert streamed == answer and out.stats["edits"][0] > 0
    assert all(len(chunk) % 4 == 0 for chunk in rec.chunks[1:-1])  # whole blocks (P = 8: the grid is P's)


def test_batch_streamer_gets_final_text(llada2):
    cases = [c for c in CASES if (c["block_length"], c["editing_threshold"]) == (8, 0.2)]
    ids, mask = left_pad([c["prompt"] for c in cases], 0)
    streamer = CollectingBatchStreamer()
    out = llada2.generate(ids, attention_mask=mask, generation_config=_cfg(cases[0], stop_at_eos=True),
                          streamer=streamer)
    for i in range(len(cases)):
        answer = out.sequences[i, ids.shape[1]:].tolist()
        answer = answer[: answer.index(EOS)] if EOS in answer else answer
        assert streamer.tokens.get(i, []) == answer


def test_edit_needs_a_block_causal_model(moe_checkpoints):
    model = load_model(moe_checkpoints["llada-moe"])
    with pytest.raises(StrategyError, match="block-causal"):
        model.generate(torch.tensor([[5, 6, 7]]), generation_config=DiffusionGenerationConfig(strategy="edit"))


def test_edit_options_are_validated():
    with pytest.raises(GenerationConfigError, match="editing_threshold"):
        DiffusionGenerationConfig(strategy="edit", editing_threshold=1.5)
    with pytest.raises(GenerationConfigError, match="max_post_steps"):
        DiffusionGenerationConfig(strategy="edit", max_post_steps=-1)


def test_edit_on_llada2_through_text_api(moe_checkpoints):
    """The checkpoint's own block size and the bundled tokenizer: generate_text works end to end."""
    model, tok = load_model(moe_checkpoints["llada2"]), dllm.load_tokenizer(moe_checkpoints["llada2"])
    res = generate_text(model, tok, ["reverse : Ann Bob"], strategy="edit", block_length=8, max_new_tokens=16)
    assert res[0].num_forwards >= 2 and res[0].finish_reason in ("stop", "length")
