"""Configs refuse what cannot run: a recipe that names no model, and models larger than the free memory,
refused before anything is built, with the estimate (parameters counted on the ``meta`` device or from
safetensors headers, x bytes for weights + gradients + AdamW states) unless ``allow_large_model=true``."""

from __future__ import annotations

import re
import time

import psutil
import pytest
import torch

from dllm.training.config import ConfigError, DistillConfig, SFTConfig, load_config
from dllm.training.distill import DistillTrainer
from dllm.training.grpo import GRPOTrainer
from dllm.training.grpo_config import load_grpo_config
from dllm.training.memory import ModelCost, ModelTooLarge, check_fits, checkpoint_parameters
from dllm.training.sft import SFTTrainer

from .conftest import micro_overrides

GB = 10**9
HUGE = "{d_model: 16384, n_layers: 64, n_heads: 128, n_kv_heads: 128, mlp_hidden_size: 65536}"  # 275B parameters


def test_a_recipe_without_a_model_is_refused_with_what_to_set(tmp_path):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    t0 = time.time()
    res = CliRunner().invoke(train_app, ["sft", "--config", str(empty), "max_steps=2", f"run_dir={tmp_path / 'run'}"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "no model to train: set model.path" in res.output and "model.config" in res.output
    assert time.time() - t0 < 10 and not (tmp_path / "run").exists()
    for cls in (SFTConfig, DistillConfig):
        with pytest.raises(ConfigError, match="model.path"):
            load_config(cls, empty)
    with pytest.raises(ConfigError, match="GRPO starts from a trained model: set model.path"):
        load_grpo_config(empty)
    with pytest.raises(ConfigError, match="no model to train"):
        SFTTrainer(SFTConfig())  # Python configs too
    with pytest.raises(ConfigError, match="no model to train"):
        load_config(SFTConfig, None, ["model.config={}"])  # an empty model.config builds LLaDA's 8B defaults


def test_a_model_larger_than_free_memory_is_refused_before_it_is_built(tmp_path):
    rss = psutil.Process().memory_info().rss
    t0 = time.time()
    with pytest.raises(ModelTooLarge) as err:
        SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "run", **{"model.config": HUGE}))).run()
    msg = str(err.value)
    assert re.search(r"the run needs at least [\d.]+ GB \(the model: [\d.]+B parameters x 16 bytes \(float32 "
                     r"weights, gradients, 2 AdamW states\)", msg), msg
    assert "available RAM" in msg and "allow_large_model=true" in msg
    assert time.time() - t0 < 20 and psutil.Process().memory_info().rss - rss < 2 * GB  # nothing was built
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_estimate_counts_what_training_builds(tmp_path, monkeypatch):
    """Parameters counted without building equal the built model's; free memory decides, and the override skips it."""
    cfg = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", max_steps=1))
    trainer = SFTTrainer(cfg)
    seen = []

    def fits(models, device, deepspeed=False, **kw):
        seen.extend(models)
        return check_fits(models, device, deepspeed, free=(1000, "available RAM (test)"))

    monkeypatch.setattr("dllm.training.engine.check_fits", fits)
    with pytest.raises(ModelTooLarge, match=r"the run needs at least 0.00 GB .* and 0.00 GB is available RAM \(test\)"):
        trainer.run()
    built = SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "ok", max_steps=1,
                                                                       allow_large_model="true")))
    assert built.run().status == "finished"  # the override: not checked, trained
    (model,) = seen
    assert model.params == sum(p.numel() for p in built.model.parameters()) and model.training_bytes == 16 * model.params
    from dllm.loading import load_model, resolve_model_path

    tiny = load_model("tiny")
    assert checkpoint_parameters(resolve_model_path("tiny")) == sum(p.numel() for p in tiny.parameters())


def test_where_the_memory_is_checked():
    model = ModelCost("the model", 10**9, "bfloat16", True)  # 2 GB of weights, 8 GB to train
    frozen = ModelCost("the reference model", 10**9, "bfloat16", False)
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    check_fits([model, frozen], cpu, free=(10 * GB, "RAM"), processes=1)
    with pytest.raises(ModelTooLarge, match=r"20.00 GB .* x 2 processes on this host"):
        check_fits([model, frozen], cpu, free=(19 * GB, "RAM"), processes=2)
    # on a GPU: weights in RAM first (per process), everything on the device; DeepSpeed decides per GPU itself
    check_fits([model], gpu, free=(9 * GB, "GPU"), ram=(3 * GB, "RAM"), processes=1)
    with pytest.raises(ModelTooLarge, match="building the models needs at least 4.00 GB of RAM"):
        check_fits([model], gpu, free=(90 * GB, "GPU"), ram=(3 * GB, "RAM"), processes=2)
    with pytest.raises(ModelTooLarge, match="8.00 GB per device"):
        check_fits([model], gpu, free=(7 * GB, "GPU"), ram=(30 * GB, "RAM"), processes=1)
    check_fits([model], gpu, deepspeed=True, free=(1 * GB, "GPU"), ram=(30 * GB, "RAM"), processes=1)


def test_distillation_and_grpo_count_their_frozen_models(tmp_path, monkeypatch):
    from dllm.testing import save_tiny_checkpoint

    save_tiny_checkpoint(tmp_path / "m", block_causal=True, block_size=4)
    n = checkpoint_parameters(tmp_path / "m")
    plans = []
    monkeypatch.setattr("dllm.training.engine.check_fits", lambda models, *a, **k: plans.append(models))

    def plan(trainer):
        trainer.setup_models()
        return [(m.label, m.params, m.trainable) for m in plans.pop()]

    base = [f"model.path={tmp_path / 'm'}", f"run_dir={tmp_path / 'r'}", "block_size=4"]
    assert plan(DistillTrainer(load_config(DistillConfig, None, base))) == [
        ("the student", n, True), ("the teacher (a frozen copy)", n, False)]
    assert plan(DistillTrainer(load_config(DistillConfig, None, base + [f"teacher={tmp_path / 'm'}"]))) == [
        ("the student", n, True), ("the teacher", n, False)]
    assert plan(DistillTrainer(load_config(DistillConfig, None, base + ["lora.enabled=true"]))) == [
        ("the student", n, False)]
    grpo = [f"model.path={tmp_path / 'm'}", f"run_dir={tmp_path / 'g'}", "data.tasks={arith: 1}",
            "data.max_new_tokens=8"]
    assert plan(GRPOTrainer(load_grpo_config(None, grpo))) == [("the policy", n, True),
                                                              ("the reference model", n, False)]
    assert plan(GRPOTrainer(load_grpo_config(None, grpo + ["loss.beta=0"]))) == [("the policy", n, True)]
