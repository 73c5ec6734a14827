"""Portable checkpoints: export to safetensors + JSON, import into a new run folder, resume bit-identically."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from dllm.errors import CheckpointError
from dllm.training.checkpointing import list_checkpoints
from dllm.training.cli import train_app
from dllm.training.config import SFTConfig, load_config
from dllm.training.portable_checkpoint import export_checkpoint, import_checkpoint
from dllm.training.sft import SFTTrainer

from .conftest import micro_overrides


def _run(run_dir, resume=False, **extra):
    cfg = load_config(SFTConfig, None, micro_overrides(run_dir, **{"max_steps": 8, "save_every": 4, **extra}))
    cfg.resume = resume
    return SFTTrainer(cfg).run()


def test_exported_checkpoint_resumes_bit_identically_in_a_new_run_folder(tmp_path):
    _run(tmp_path / "a")  # the uninterrupted run: checkpoints at 4 and 8 (keep_checkpoints default)

    portable = export_checkpoint(tmp_path / "a", tmp_path / "portable", step=4)
    names = sorted(p.name for p in portable.iterdir())
    assert all(n.endswith(".safetensors") for n in names if n != "checkpoint.json")  # no pickle in it
    assert "model.safetensors" in names and "optimizer_bin.safetensors" in names
    index = json.loads((portable / "checkpoint.json").read_text())
    assert index["step"] == 4 and set(index["run_files"]) >= {"config.yaml", "metrics.csv"}

    written = import_checkpoint(portable, tmp_path / "b")
    assert written == tmp_path / "b" / "checkpoints" / "step-0000004"
    result = _run(tmp_path / "b", resume=True)
    assert result.step == 8
    end_a = tmp_path / "a" / "checkpoints" / "step-0000008"
    end_b = tmp_path / "b" / "checkpoints" / "step-0000008"
    a, b = load_file(str(end_a / "model.safetensors")), load_file(str(end_b / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt_a = torch.load(end_a / "optimizer.bin", weights_only=False)
    opt_b = torch.load(end_b / "optimizer.bin", weights_only=False)
    for k, st in opt_a["state"].items():
        assert torch.equal(st["exp_avg"], opt_b["state"][k]["exp_avg"])
        assert torch.equal(st["exp_avg_sq"], opt_b["state"][k]["exp_avg_sq"])
    # the imported metrics rows 1-4 continue into 5-8 with the same losses as the uninterrupted run
    rows_a = (tmp_path / "a" / "metrics.csv").read_text().splitlines()
    rows_b = (tmp_path / "b" / "metrics.csv").read_text().splitlines()
    losses = [[r.split(",")[:2] for r in rows[1:]] for rows in (rows_a, rows_b)]
    assert losses[0] == losses[1] and len(losses[0]) == 8


def test_import_refuses_a_run_folder_with_checkpoints_and_a_foreign_folder(tmp_path):
    _run(tmp_path / "a", max_steps=4, save_every=0)
    portable = export_checkpoint(tmp_path / "a", tmp_path / "portable")
    with pytest.raises(CheckpointError, match="already has checkpoints"):
        import_checkpoint(portable, tmp_path / "a")
    with pytest.raises(CheckpointError, match="not a portable checkpoint"):
        import_checkpoint(tmp_path / "a", tmp_path / "c")
    with pytest.raises(CheckpointError, match="no checkpoint of step 3"):
        export_checkpoint(tmp_path / "a", tmp_path / "p2", step=3)


def test_cli_round_trip_and_one_line_errors(tmp_path):
    _run(tmp_path / "a", max_steps=4, save_every=0)
    runner = CliRunner()
    out = runner.invoke(train_app, ["export-checkpoint", str(tmp_path / "a"), str(tmp_path / "p")])
    assert out.exit_code == 0, out.output
    out = runner.invoke(train_app, ["import-checkpoint", str(tmp_path / "p"), str(tmp_path / "b")])
    assert out.exit_code == 0, out.output
    assert [s for s, _ in list_checkpoints(tmp_path / "b")] == [4]
    out = runner.invoke(train_app, ["export-checkpoint", str(tmp_path / "nowhere"), str(tmp_path / "q")])
    assert out.exit_code == 2 and "Traceback" not in out.output
