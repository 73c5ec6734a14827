"""dllm train export-model: a checkpoint's model folder, as the run would export it, without touching the run."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from dllm.errors import CheckpointError
from dllm.training.cli import train_app
from dllm.training.config import ConfigError, DistillConfig, SFTConfig, load_config, to_dict
from dllm.training.grpo_config import GRPOConfig
from dllm.training.kinds import trainer_kind
from dllm.training.model_export import export_checkpoint_model
from dllm.training.run_lock import RunLock
from dllm.training.sft import SFTTrainer

from .conftest import micro_overrides


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished micro SFT run with checkpoints at steps 4 and 8 and its export."""
    run_dir = tmp_path_factory.mktemp("export") / "run"
    SFTTrainer(load_config(SFTConfig, None, micro_overrides(run_dir, max_steps=8, save_every=4))).run()
    return run_dir


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_the_latest_checkpoint_exports_what_the_run_exported(run, tmp_path):
    before = _digests(run / "checkpoints" / "step-0000008")
    out = export_checkpoint_model(run, tmp_path / "m8")
    final = load_file(str(run / "final" / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    assert final.keys() == got.keys() and all(torch.equal(final[k], got[k]) for k in final)
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (out / name).read_text() == (run / "final" / name).read_text(), name
    assert _digests(run / "checkpoints" / "step-0000008") == before  # hard links, never written through


def test_an_earlier_checkpoint_while_the_run_holds_its_lock(run, tmp_path):
    lock = RunLock(run, "dllm train sft ...")
    lock.acquire()  # a live trainer in the run folder: exporting reads it and writes nothing there
    try:
        res = CliRunner().invoke(train_app, ["export-model", str(run), str(tmp_path / "m4"), "--step", "4"])
    finally:
        lock.release()
    assert res.exit_code == 0, res.output
    ckpt = load_file(str(run / "checkpoints" / "step-0000004" / "model.safetensors"))
    got = load_file(str(tmp_path / "m4" / "model.safetensors"))
    assert all(torch.equal(ckpt[k], got[k]) for k in ckpt)
    assert not all(torch.equal(got[k], v) for k, v in load_file(str(run / "final" / "model.safetensors")).items())
    info = json.loads((tmp_path / "m4" / "training_info.json").read_text())
    assert info["trainer"] == "sft" and info["steps"] == 4
    assert info["config"] == yaml.safe_load((run / "config.yaml").read_text())  # the run's, max_steps 8 and all
    assert info["checkpoint"].endswith("checkpoints/step-0000004")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export-model-")]  # its scratch run is gone


def test_mistakes_are_one_line(run, tmp_path):
    res = CliRunner().invoke(train_app, ["export-model", str(run), str(tmp_path / "m"), "--step", "5"])
    assert res.exit_code == 2 and "has no checkpoint of step 5 (checkpoints: 4, 8)" in res.output
    res = CliRunner().invoke(train_app, ["export-model", str(tmp_path), str(tmp_path / "m")])
    assert res.exit_code == 2 and "neither a run folder with checkpoints" in res.output
    gone = tmp_path / "gone"  # a finished run whose checkpoints were removed
    (gone / "final").mkdir(parents=True)
    (gone / "config.yaml").write_text((run / "config.yaml").read_text())
    (gone / "final" / "config.json").write_text((run / "final" / "config.json").read_text())
    res = CliRunner().invoke(train_app, ["export-model", str(gone), str(tmp_path / "m")])
    assert res.exit_code == 2 and "is a run folder with no checkpoint left" in res.output
    assert f"its exported model is {gone / 'final'}" in res.output.replace("\n", "")
    with pytest.raises(ConfigError, match="inside the run's checkpoints"):
        export_checkpoint_model(run, run / "checkpoints" / "model")
    with pytest.raises(ConfigError, match="holds the run folder"):
        export_checkpoint_model(run, run.parent)
    (tmp_path / "notes.txt").write_text("x")
    res = CliRunner().invoke(train_app, ["export-model", str(run), str(tmp_path / "notes.txt")])
    assert res.exit_code == 2 and "notes.txt is a file; name a folder" in res.output
    res = CliRunner().invoke(train_app, ["export-model", str(run), str(tmp_path)])  # a folder of other things
    assert res.exit_code == 2 and "holds files but no model" in res.output and (tmp_path / "notes.txt").exists()
    bare = tmp_path / "bare" / "checkpoints" / "step-0000002"
    bare.mkdir(parents=True)
    (bare / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="has no config.yaml"):
        export_checkpoint_model(bare, tmp_path / "m")


def test_the_trainer_is_told_by_its_config_keys():
    for cls, kind in ((SFTConfig, "sft"), (DistillConfig, "distill"), (GRPOConfig, "grpo")):
        assert trainer_kind(to_dict(cls())) == kind
        # a run written before a field was added (here: overwrite, progress) is still told
        older = {k: v for k, v in to_dict(cls()).items() if k not in ("overwrite", "progress")}
        assert trainer_kind(older) == kind
    with pytest.raises(ConfigError, match="not the config of an sft, distill or grpo run"):
        trainer_kind({"max_steps": 3})  # keys every trainer has
    with pytest.raises(ConfigError, match="not the config of an sft, distill or grpo run"):
        trainer_kind({**to_dict(SFTConfig()), "rollout": {}})  # keys of two trainers


def test_loading_a_run_folder_says_what_to_load_instead(run, tmp_path):
    from dllm.loading import load_model

    with pytest.raises(CheckpointError, match=r"is a training run's folder, not a model folder: its exported model is "
                                              r".*final; `dllm train export-model .* OUT` writes"):
        load_model(run)
    step = run / "checkpoints" / "step-0000004"
    with pytest.raises(CheckpointError, match=rf"{step} is a checkpoint of a training run, not a model folder: .*"
                                              rf"`dllm train export-model {step} OUT`"):
        load_model(step)
    with pytest.raises(CheckpointError, match="has no config.json; is this a model directory"):
        load_model(tmp_path)  # a folder of nothing in particular


def test_a_run_with_its_own_export_dir_names_that_model(run, tmp_path):
    """A run exported elsewhere (``export_dir``): the hints name that folder, not ``RUN/final``."""
    from dllm.loading import load_model

    moved = tmp_path / "moved"  # a finished run whose checkpoints were removed, its model in its own folder
    (moved / "run").mkdir(parents=True)
    (moved / "models" / "v1").mkdir(parents=True)
    config = yaml.safe_load((run / "config.yaml").read_text())
    (moved / "run" / "config.yaml").write_text(yaml.safe_dump({**config, "export_dir": str(moved / "models" / "v1")}))
    (moved / "models" / "v1" / "config.json").write_text((run / "final" / "config.json").read_text())
    res = CliRunner().invoke(train_app, ["export-model", str(moved / "run"), str(tmp_path / "m")])
    assert res.exit_code == 2 and f"its exported model is {moved / 'models' / 'v1'}" in res.output.replace("\n", "")
    with pytest.raises(CheckpointError, match=rf"its exported model is {moved / 'models' / 'v1'}$"):
        load_model(moved / "run")
