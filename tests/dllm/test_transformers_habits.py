"""What a transformers user does with a model works on dllm models: save and reload without losing the
decoding defaults, ``forward(labels=...)`` gives a loss, PEFT's causal-LM wrapper trains."""

import json

import pytest
import torch

import dllm
from dllm.modeling.losses import IGNORE_INDEX
from dllm.testing import MASK, tiny_dream, tiny_llada


@pytest.mark.parametrize("name", ["tiny", "tiny-d2f"])
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
