"""D2F distillation trainer: teacher/student views, LoRA and full-weight runs, exports."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dllm.modeling import LLaDAConfig, LLaDAModelLM
from dllm.tokenization import special_token_ids
from dllm.training.config import DistillConfig, load_config
from dllm.training.data import collate
from dllm.training.distill import DistillTrainer

from .conftest import MICRO_MODEL


@pytest.fixture
def teacher_dir(tmp_path, tokenizer):
    torch.manual_seed(0)
    cfg = LLaDAConfig(vocab_size=len(tokenizer), embedding_size=len(tokenizer), rope_theta=10000.0,
                      **special_token_ids(tokenizer), **MICRO_MODEL)
    path = tmp_path / "teacher"
    LLaDAModelLM(cfg).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def _overrides(tmp_path, teacher_dir, **extra):
    base = {"run_dir": str(tmp_path / "run"), "max_steps": 4, "batch_size": 4, "num_threads": 1,
            "log_every": 1, "save_every": 2, "progress": "false", "model.path": str(teacher_dir),
            "block_size": 4, "data.tasks": "{arith: 1, lists: 1}", "data.max_new_tokens": 12,
            "data.chunk_size": 64, "optim.lr": "1e-3"}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def test_loss_is_soft_ce_from_bidirectional_teacher_to_block_causal_student(monkeypatch, tmp_path, teacher_dir,
                                                                               tokenizer):
    import dllm.training.distill as mod

    cfg = load_config(DistillConfig, None, _overrides(tmp_path, teacher_dir, teacher=str(teacher_dir)))
    trainer = DistillTrainer(cfg)
    trainer.setup_models()
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tokenizer.eos_token_id
    batch = collate([(enc("What is 1 + 2 ?"), enc("3") + [eos]), (enc("What is 10 + 2 ?"), enc("12") + [eos])],
                    gen_length=8, pad_id=tokenizer.pad_token_id, eos_id=eos)
    p = batch.prompt_length
    masked = torch.zeros_like(batch.answer_mask)
    masked[0, p] = masked[0, p + 5] = masked[1, p + 1] = True
    p_mask = torch.zeros(masked.shape)
    p_mask[:, p:p + 4], p_mask[:, p + 4:] = 0.4, 0.6
    noisy = torch.where(masked, torch.full_like(batch.input_ids, tokenizer.mask_token_id), batch.input_ids)
    monkeypatch.setattr(mod, "d2f_noise", lambda *a, **k: (noisy, masked, p_mask))
    got = trainer.compute_loss(trainer.model, batch, torch.Generator())

    with torch.no_grad():
        t = trainer.teacher(noisy, attention_mask=batch.attention_mask, attention_policy="bidirectional").logits
        s = trainer.model(noisy, attention_mask=batch.attention_mask, prompt_length=p,
                          attention_policy="block_causal", block_size=4).logits
    terms = []
    for i, j in zip(*torch.nonzero(masked, as_tuple=True)):
        ce = -(torch.softmax(t[i, j], -1) * torch.log_softmax(s[i, j], -1)).sum()
        terms.append(float(ce) / float(p_mask[i, j]))
    assert math.isclose(float(got.detach()), sum(terms) / len(terms), rel_tol=1e-5)
    # the two views really differ (otherwise the test above would not tell them apart)
    s_bi = trainer.model(noisy, attention_mask=batch.attention_mask, attention_policy="bidirectional").logits
    assert not torch.allclose(s_bi[:, p:], s[:, p:])


def test_full_weight_distill_run_exports_block_causal_model(tmp_path, teacher_dir):
    from transformers import AutoModel

    import dllm  # noqa: F401

    cfg = load_config(DistillConfig, None, _overrides(tmp_path, teacher_dir, teacher=str(teacher_dir)))
    trainer = DistillTrainer(cfg)
    result = trainer.run()
    assert result.status == "finished"
    final = tmp_path / "run" / "final"
    conf = json.loads((final / "config.json").read_text())
    assert conf["attention_policy"] == "block_causal" and conf["block_size"] == 4
    model = AutoModel.from_pretrained(str(final))
    assert model.is_block_causal
    before = AutoModel.from_pretrained(str(teacher_dir))
    for (k, a), b in zip(before.state_dict().items(), trainer.teacher.state_dict().values()):
        assert torch.equal(a, b), f"teacher weight {k} changed"


def test_lora_distill_uses_disabled_adapter_as_teacher(tmp_path, teacher_dir):
    from dllm.loading import load_model

    cfg = load_config(DistillConfig, None, _overrides(
        tmp_path, teacher_dir, **{"lora.enabled": "true", "lora.r": 4, "lora.alpha": 8, "lora.dropout": 0.0}))
    trainer = DistillTrainer(cfg)
    result = trainer.run()
    assert result.status == "finished" and trainer.teacher is None
    final = tmp_path / "run" / "final"
    assert (final / "adapter" / "adapter_config.json").exists()
    # the adapter ships for the unmodified bidirectional base and loads on it, block-causally
    student = load_model(teacher_dir, adapter=final / "adapter", attention_policy="block_causal", block_size=4)
    merged = load_model(final)
    for k, v in merged.state_dict().items():
        assert torch.allclose(v, student.state_dict()[k], atol=1e-6), k
    base = load_model(teacher_dir)
    n_trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert 0 < n_trainable < sum(p.numel() for p in base.parameters()) / 2


def test_distill_student_grown_from_a_checkpoint(tmp_path, teacher_dir):
    from dllm.loading import load_model

    wide = dict(MICRO_MODEL, mlp_hidden_size=96)
    over = _overrides(tmp_path, teacher_dir, teacher=str(teacher_dir), max_steps=1, **{
        "model.path": "null", "model.grow_from": str(teacher_dir),
        "model.config": "{" + ", ".join(f"{k}: {v}" for k, v in wide.items()) + "}"})
    trainer = DistillTrainer(load_config(DistillConfig, None, over))
    trainer.setup_models()
    assert trainer.model.is_block_causal and trainer.model.config.mlp_hidden_size == 96
    src = load_model(str(teacher_dir)).model.transformer.blocks[0]
    block = trainer.model.model.transformer.blocks[0]
    assert torch.equal(block.ff_proj.weight[:64], src.ff_proj.weight) and not block.ff_out.weight[:, 64:].any()
    result = DistillTrainer(load_config(DistillConfig, None, over)).run()
    assert result.status == "finished"
    conf = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert conf["mlp_hidden_size"] == 96 and conf["attention_policy"] == "block_causal"


def test_distill_on_a_data_file_with_context_bound(tmp_path, teacher_dir, capsys):
    """Own data (chat form) mixed with a suite; the teacher's context drops a prompt that cannot fit."""
    rows = [{"messages": [{"role": "user", "content": "copy : Ann Bob"}, {"role": "assistant", "content": "Ann Bob"}]},
            {"messages": [{"role": "user", "content": "copy : " + " Ann" * 5000}, {"role": "assistant", "content": "Ann"}]}]
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(DistillConfig, None, _overrides(tmp_path, teacher_dir, max_steps=2, **{
        "data.tasks": "{lists: 1}", "data.files": f"{{{f}: 3}}"}))
    result = DistillTrainer(cfg).run()
    assert result.status == "finished"
    err = capsys.readouterr().err
    assert f"data file {f} (chat): 1 of 2 examples used" in err and "longer than the model's context" in err
