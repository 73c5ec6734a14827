"""Training the mixture-of-experts formats: SFT with LoRA on attention and expert projections, GRPO.

The tiny checkpoints are the published layouts of tests/fixtures/moe/; what a run exports loads again
in dllm and keeps the published tensor names.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dllm
from dllm.training import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "moe"
TARGETS = {  # attention projections and every expert's (routed, shared and dense MLP) projections
    "llada2": ["query_key_value", "dense", "gate_proj", "up_proj", "down_proj"],
    "llada-moe": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


@pytest.mark.parametrize("family", ["llada2", "llada-moe"])
def test_sft_with_lora_on_attention_and_experts(moe_checkpoints, tmp_path, family):
    cfg = SFTConfig(run_dir=str(tmp_path / "run"), max_steps=3, batch_size=4, num_threads=1, log_every=1,
                    save_every=0, progress=False, model={"path": str(moe_checkpoints[family])},
                    data={"tasks": {"arith": 1}, "max_new_tokens": 16}, optim={"lr": 1e-2, "warmup_steps": 0},
                    lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": TARGETS[family]})
    trainer = SFTTrainer(cfg)
    result = trainer.train()
    assert result.status == "finished"
    adapted = {n for n, _ in trainer.model.named_modules() if n.endswith("lora_B")}
    assert any(".experts.3.up_proj." in n for n in adapted)  # a routed expert
    assert any(("query_key_value" if family == "llada2" else "self_attn.q_proj") in n for n in adapted)
    moved = [p for n, p in trainer.model.named_parameters() if "experts" in n and n.endswith("lora_B.default.weight")]
    assert any(bool(p.detach().abs().sum() > 0) for p in moved)  # LoRA B starts at zero: experts were trained
    export = result.export_dir
    index = json.loads((export / "model.safetensors.index.json").read_text()) if (
        export / "model.safetensors.index.json").exists() else None
    names = set(index["weight_map"]) if index else set(
        __import__("safetensors").safe_open(str(export / "model.safetensors"), "pt").keys())
    assert names == set(json.loads((FIXTURES / "reference_tensor_names.json").read_text())[family])
    before, after = dllm.load_model(moe_checkpoints[family]), dllm.load_model(export)
    ids = torch.randint(4, 402, (1, 12))
    with torch.no_grad():
        assert not torch.equal(before(ids).logits, after(ids).logits)


def test_grpo_on_llada2_with_edit_rollouts(moe_checkpoints, tmp_path):
    cfg = GRPOConfig(run_dir=str(tmp_path / "grpo"), max_steps=2, batch_size=64, num_threads=1, log_every=1,
                     save_every=0, progress=False, model={"path": str(moe_checkpoints["llada2"])},
                     data={"tasks": {"arith": 1}, "max_new_tokens": 8, "mix": "per_example"},
                     rollout={"group_size": 4, "prompts_per_step": 2, "max_refill_rounds": 0, "strategy": "edit",
                              "temperature": 1.0, "threshold": 0.9, "options": {"editing_threshold": 0.8}},
                     filter={"enabled": False}, loss={"estimator": "block_masked"},
                     optim={"lr": 1e-4, "schedule": "constant", "warmup_steps": 0})
    result = GRPOTrainer(cfg).train()
    assert result.status == "finished" and result.step == 2
    exported = dllm.load_model(result.export_dir)
    assert isinstance(exported, dllm.modeling.LLaDA2MoeModelLM)
    # the published checkpoint had no dllm decoding defaults: the export keeps its family's decoder
    assert exported.diffusion_generation_config.strategy == "edit"


def test_grpo_on_llada_moe_with_threshold_rollouts(moe_checkpoints, tmp_path):
    # LLaDA-MoE is bidirectional: no `edit`; the answer spans whole rollout blocks (32 slots)
    cfg = GRPOConfig(run_dir=str(tmp_path / "grpo"), max_steps=2, batch_size=64, num_threads=1, log_every=1,
                     save_every=0, progress=False, model={"path": str(moe_checkpoints["llada-moe"])},
                     data={"tasks": {"arith": 1}, "max_new_tokens": 32, "mix": "per_example"},
                     rollout={"group_size": 4, "prompts_per_step": 2, "max_refill_rounds": 0, "strategy": "threshold",
                              "temperature": 1.0, "threshold": 0.9},
                     filter={"enabled": False}, loss={"estimator": "block_masked"},
                     optim={"lr": 1e-4, "schedule": "constant", "warmup_steps": 0})
    result = GRPOTrainer(cfg).train()
    assert result.status == "finished" and result.step == 2 and result.updates == 2
    export = Path(result.export_dir)
    assert json.loads((export / "config.json").read_text())["architectures"] == ["LLaDAMoEModelLM"]
    index = json.loads((export / "model.safetensors.index.json").read_text()) if (
        export / "model.safetensors.index.json").exists() else None
    names = set(index["weight_map"]) if index else set(
        __import__("safetensors").safe_open(str(export / "model.safetensors"), "pt").keys())
    assert names == set(json.loads((FIXTURES / "reference_tensor_names.json").read_text())["llada-moe"])
    exported = dllm.load_model(export)
    assert isinstance(exported, dllm.modeling.LLaDAMoEModelLM)
    assert exported.diffusion_generation_config.strategy == "threshold"


def test_block_diffusion_sft_on_sdar_moe_keeps_the_published_names(tmp_path):
    """SDAR-MoE trains as SDAR does (block-causal, so block-diffusion SFT) with LoRA on the experts; the export
    has the folder's tensor names and loads again."""
    from safetensors import safe_open

    from dllm.testing import save_tiny_moe_checkpoint

    folder = tmp_path / "sdar-moe"
    save_tiny_moe_checkpoint(folder, "sdar-moe", seed=0, scale=2.0)
    cfg = SFTConfig(run_dir=str(tmp_path / "run"), max_steps=2, batch_size=4, num_threads=1, log_every=1,
                    save_every=0, progress=False, model={"path": str(folder)},
                    data={"tasks": {"arith": 1}, "max_new_tokens": 8}, optim={"lr": 1e-2, "warmup_steps": 0},
                    lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0,
                          "target_modules": ["q_proj", "gate_proj", "up_proj", "down_proj"]})
    result = SFTTrainer(cfg).train()
    assert result.status == "finished"

    def names(d: Path) -> set[str]:
        index = d / "model.safetensors.index.json"
        if index.exists():
            return set(json.loads(index.read_text())["weight_map"])
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            return set(f.keys())

    assert names(result.export_dir) == names(folder)
    before, after = dllm.load_model(folder), dllm.load_model(result.export_dir)
    ids = torch.randint(4, 402, (1, 12))
    with torch.no_grad():
        assert not torch.equal(before(ids, prompt_length=None).logits, after(ids, prompt_length=None).logits)
