"""What a transformers user does with a model works on dllm models: save and reload without losing the
decoding defaults, ``forward(labels=...)`` gives a loss, PEFT's causal-LM wrapper trains."""

import json

import pytest
import torch

import dllm
from dllm.modeling.losses import IGNORE_INDEX
from dllm.testing import MASK, tiny_dream, tiny_llada


@pytest.mark.parametrize("name", ["tiny", "tiny-d2f", "tiny-long", "tiny-long-d2f"])
def test_save_and_reload_decode_the_same_tokens(name, tmp_path):
    model, tok = dllm.load_model(name), dllm.load_tokenizer(name)
    prompts = ["What is 123 + 45 ?", "reverse : Ann Bob Cal", "sort : Pam Lee Ann Max"]
    before = dllm.generate_text(model, tok, prompts)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["dllm"] == model.diffusion_generation_config.to_dict()
    again = dllm.load_model(tmp_path)
    assert again.diffusion_generation_config == model.diffusion_generation_config
    for key in ("mask_token_id", "eos_token_id", "pad_token_id", "attention_policy", "block_size"):
        assert getattr(again.config, key, None) == getattr(model.config, key, None), key
    after = dllm.generate_text(again, dllm.load_tokenizer(tmp_path), prompts)
    assert [r.token_ids for r in after] == [r.token_ids for r in before]
    assert [r.num_forwards for r in after] == [r.num_forwards for r in before]


@pytest.mark.parametrize("make", [tiny_llada, tiny_dream], ids=["llada", "dream"])
def test_labels_give_the_masked_diffusion_loss(make):
    model = make()
    ids = torch.randint(0, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :5] = IGNORE_INDEX  # the prompt takes no loss
    torch.manual_seed(0)
    out = model(input_ids=ids, labels=labels)
    assert out.loss is not None and out.loss.ndim == 0 and torch.isfinite(out.loss) and out.loss > 0
    assert out.logits.shape == (3, 12, model.config.vocab_size)
    # the same draw by hand: mask labelled positions with the row's p, CE / p over the labelled count
    torch.manual_seed(0)
    t = torch.rand((3, 1))
    p = (1 - 1e-3) * t + 1e-3
    masked = (torch.rand(ids.shape) < p) & (labels != IGNORE_INDEX)
    noisy = torch.where(masked, torch.full_like(ids, MASK), ids)
    logits = model(input_ids=noisy).logits
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none") * masked
    expected = ((ce / p).sum(1) / 7).mean()
    assert torch.allclose(out.loss, expected, atol=1e-5)
    assert model(input_ids=ids).loss is None
    with pytest.raises(ValueError, match="same shape"):
        model(input_ids=ids, labels=labels[:, :4])


def test_peft_causal_lm_wraps_and_trains():
    from peft import LoraConfig, get_peft_model

    model = tiny_llada()
    peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj"], r=4))
    opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 60, (4, 10), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :3] = IGNORE_INDEX
    lora = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_B" in n}
    for _ in range(3):
        loss = peft_model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    changed = [n for n, p in peft_model.named_parameters() if "lora_B" in n and not torch.equal(p, lora[n])]
    assert len(changed) == len(lora) > 0
    out = peft_model.generate(ids[:, :3], max_new_tokens=8, block_length=8, return_dict_in_generate=True)
    assert out.sequences.shape == (4, 11)


# --- generate speaks transformers -------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundled():
    from dllm.text import encode_prompts

    model, tok = dllm.load_model("tiny"), dllm.load_tokenizer("tiny")
    ids, mask = encode_prompts(tok, ["What is 123 + 45 ?", "sort : Pam Lee Ann Max Bob Oli Ned Eve"])
    return model, tok, ids, mask


def _answers(tok, out, prompt_len):
    seqs = out.sequences if hasattr(out, "sequences") else out
    return tok.batch_decode(seqs[:, prompt_len:], skip_special_tokens=True)


def test_sampling_switches_and_lengths(bundled):
    model, tok, ids, mask = bundled
    P = ids.shape[1]
    greedy = model.generate(ids, attention_mask=mask, temperature=0.0)
    assert torch.equal(model.generate(ids, attention_mask=mask, do_sample=False, temperature=0.9), greedy)
    sampled = model.generate(ids, attention_mask=mask, do_sample=True, seed=3, return_dict_in_generate=True)
    same = model.generate(ids, attention_mask=mask, temperature=1.0, seed=3, return_dict_in_generate=True)
    assert torch.equal(sampled.sequences, same.sequences)
    assert model.generate(ids, attention_mask=mask, max_length=P + 20).shape == (2, P + 20)


def test_max_new_tokens_of_any_size_cuts_the_answer(bundled):
    model, tok, ids, mask = bundled
    P = ids.shape[1]
    full = model.generate(ids, attention_mask=mask, max_new_tokens=64, block_length=32, return_dict_in_generate=True)
    assert _answers(tok, full, P) == ["168", "Ann Bob Eve Lee Max Ned Oli Pam"]
    assert full.finish_reason == ["stop", "stop"]
    short = model.generate(ids, attention_mask=mask, max_new_tokens=6, block_length=32, return_dict_in_generate=True)
    assert short.sequences.shape == (2, P + 6) and short.step_map.shape == (2, 6)
    assert short.finish_reason == ["stop", "length"]  # "168" + EOS fits in 6 tokens, the sorted list does not
    assert short.generated_tokens.tolist() == [5, 6]
    assert _answers(tok, short, P)[0] == "168" and "Ann Bob" in _answers(tok, short, P)[1]
    assert torch.equal(short.sequences[0], full.sequences[0, : P + 6])
    assert bool((short.num_forwards <= full.num_forwards).all())


def test_num_return_sequences_and_special_ids(bundled):
    model, tok, ids, mask = bundled
    out = model.generate(ids, attention_mask=mask, num_return_sequences=3, return_dict_in_generate=True)
    assert out.sequences.shape[0] == 6
    assert _answers(tok, out, ids.shape[1]) == ["168"] * 3 + ["Ann Bob Eve Lee Max Ned Oli Pam"] * 3
    # eos_token_id overridden to an id never generated: rows run to the end of the canvas; a list stops
    # at any of its ids, as in transformers (tests/decoding/test_eos_ids.py)
    never = tok.convert_tokens_to_ids("<|unk|>")
    longer = model.generate(ids[:1], attention_mask=mask[:1], eos_token_id=never, max_new_tokens=8,
                            return_dict_in_generate=True)
    assert longer.finish_reason == ["length"]
    listed = model.generate(ids[:1], attention_mask=mask[:1], eos_token_id=[never, tok.eos_token_id],
                            max_new_tokens=8, return_dict_in_generate=True)
    assert listed.finish_reason == ["stop"]
    with pytest.raises(dllm.GenerationConfigError, match="num_return_sequences"):
        model.generate(ids, num_return_sequences=0)
    with pytest.raises(dllm.GenerationConfigError, match="unknown generation option"):
        model.generate(ids, no_such_option=1)


def test_a_transformers_generation_config(bundled):
    import warnings

    from transformers import GenerationConfig

    model, tok, ids, mask = bundled
    cfg = GenerationConfig(max_new_tokens=8, do_sample=True, temperature=0.01, num_return_sequences=2,
                           return_dict_in_generate=True)  # transformers allows n > 1 only when sampling
    out = model.generate(ids, attention_mask=mask, generation_config=cfg)
    assert out.sequences.shape == (4, ids.shape[1] + 8) and _answers(tok, out, ids.shape[1])[0] == "168"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.generate(ids, attention_mask=mask, generation_config=GenerationConfig(num_beams=4, repetition_penalty=1.3,
                                                                                   max_new_tokens=8))
    [warning] = [w for w in caught if "generate ignores" in str(w.message)]
    assert "num_beams=4" in str(warning.message) and "repetition_penalty=1.3" in str(warning.message)
    with pytest.raises(TypeError, match="generation_config"):
        model.generate(ids, generation_config={"max_new_tokens": 8})


def test_text_generation_pipeline(bundled):
    from transformers import pipeline

    model, tok, _, _ = bundled
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    [chat] = pipe([{"role": "user", "content": "reverse : Ann Bob Cal"}], max_new_tokens=8)
    assert chat["generated_text"][-1] == {"role": "assistant", "content": "Cal Bob Ann"}
    [plain] = pipe("<|user|> What is 12 + 30 ? <|assistant|>", max_new_tokens=8, return_full_text=False)
    assert plain["generated_text"] == "42"


def test_a_transformers_streamer_stops_at_max_new_tokens(bundled, capsys):
    from transformers import TextStreamer

    model, tok, ids, mask = bundled
    model.generate(ids[1:], attention_mask=mask[1:], max_new_tokens=4, streamer=TextStreamer(tok, skip_prompt=True))
    streamed = capsys.readouterr().out.strip()
    assert streamed == tok.decode(model.generate(ids[1:], attention_mask=mask[1:], max_new_tokens=4)[0, ids.shape[1]:],
                                  skip_special_tokens=True).strip()
    assert len(streamed.split()) <= 4
