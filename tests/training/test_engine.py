"""The shared engine: checkpoints, bit-identical resume, the NaN guard, export (signals and other faults: test_faults.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm.training.checkpointing import list_checkpoints
from dllm.training.config import SFTConfig, load_config
from dllm.training.engine import RunDirInUse, TrainingDiverged
from dllm.training.sft import SFTTrainer

from .conftest import REPO, micro_overrides


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model.safetensors"))


def test_smoke_run_exports_a_loadable_model(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    import dllm  # noqa: F401  (registers the model classes)

    cfg = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", save_every=3))
    result = SFTTrainer(cfg).run()
    assert result.status == "finished" and result.step == 6
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [3, 6]
    final = tmp_path / "run" / "final"
    model = AutoModel.from_pretrained(str(final))
    tok = AutoTokenizer.from_pretrained(str(final))
    assert model.config.mask_token_id == tok.mask_token_id
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    from dllm.decoding.config import DiffusionGenerationConfig

    gen = DiffusionGenerationConfig.from_pretrained(final)
    assert gen.max_new_tokens == 8 and gen.mask_token_id == tok.mask_token_id
    assert not any(p.name.startswith("optimizer") for p in final.iterdir())  # no optimizer state in exports
    ids = torch.tensor([tok("What is 1 + 2 ?")["input_ids"]])
    assert model(ids).logits.shape[-1] == len(tok)
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert rows[0].startswith("step,loss,lr") and len(rows) == 7


def test_resume_is_bit_identical(tmp_path):
    full = load_config(SFTConfig, None, micro_overrides(tmp_path / "a", max_steps=8, save_every=4))
    SFTTrainer(full).run()

    class Crash(SFTTrainer):
        calls = 0

        def compute_loss(self, model, batch, generator):
            Crash.calls += 1
            if Crash.calls == 7:  # crash during step 7, after the step-4 checkpoint
                raise RuntimeError("simulated crash")
            return super().compute_loss(model, batch, generator)

    part = load_config(SFTConfig, None, micro_overrides(tmp_path / "b", max_steps=8, save_every=4))
    with pytest.raises(RuntimeError, match="simulated crash"):
        Crash(part).run()
    assert [s for s, _ in list_checkpoints(tmp_path / "b")] == [4]
    with pytest.raises(RunDirInUse):
        SFTTrainer(part).run()  # a run dir with checkpoints needs resume=true
    part.resume = True
    result = SFTTrainer(part).run()
    assert result.step == 8
    a, b = _weights(tmp_path / "a" / "checkpoints" / "step-0000008"), _weights(tmp_path / "b" / "checkpoints" / "step-0000008")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    opt_a = torch.load(tmp_path / "a" / "checkpoints" / "step-0000008" / "optimizer.bin", weights_only=False)
    opt_b = torch.load(tmp_path / "b" / "checkpoints" / "step-0000008" / "optimizer.bin", weights_only=False)
    for k, st in opt_a["state"].items():
        assert torch.equal(st["exp_avg"], opt_b["state"][k]["exp_avg"])
    # the metrics of the crashed attempt after step 4 were dropped and rewritten by the resumed run
    steps = [int(r.split(",")[0]) for r in (tmp_path / "b" / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == list(range(1, 9))


def test_a_run_from_step_0_never_replaces_an_earlier_run_unasked(tmp_path):
    """A finished run whose checkpoints were removed leaves its log, config and model: a new run there, or
    a resume with nothing to resume, is refused before it writes a byte; overwrite=true replaces them."""
    run = tmp_path / "run"
    over = micro_overrides(run, max_steps=2)
    SFTTrainer(load_config(SFTConfig, None, over)).run()
    shutil.rmtree(run / "checkpoints")
    kept = {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.csv", "final/model.safetensors")}
    with pytest.raises(RunDirInUse, match=r"earlier run \(config.yaml, metrics.csv, the exported model .*final\)"
                                          r".*overwrite=true"):
        SFTTrainer(load_config(SFTConfig, None, over + ["seed=1"])).run()
    with pytest.raises(RunDirInUse, match="no checkpoint to resume, but .*final holds an exported model"):
        SFTTrainer(load_config(SFTConfig, None, over + ["seed=1", "resume=true"])).run()
    assert {name: (run / name).read_bytes() for name in kept} == kept
    assert SFTTrainer(load_config(SFTConfig, None, over + ["seed=1", "overwrite=true"])).run().status == "finished"
    assert (run / "final" / "model.safetensors").read_bytes() != kept["final/model.safetensors"]
    # a run killed before its first checkpoint left only its config and log: --resume takes it over
    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "final")
    assert SFTTrainer(load_config(SFTConfig, None, over + ["resume=true"])).run().status == "finished"


def test_nan_guard_keeps_last_good_checkpoint(tmp_path):
    class Diverges(SFTTrainer):
        calls = 0

        def compute_loss(self, model, batch, generator):
            Diverges.calls += 1
            loss = super().compute_loss(model, batch, generator)
            return loss * float("nan") if Diverges.calls == 4 else loss

    cfg = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", save_every=2))
    with pytest.raises(TrainingDiverged) as err:
        Diverges(cfg).run()
    msg = str(err.value)
    assert "non-finite loss" in msg and "step 4" in msg and "step-0000002" in msg
    ckpts = list_checkpoints(tmp_path / "run")
    assert [s for s, _ in ckpts] == [2]
    assert all(torch.isfinite(t).all() for t in _weights(ckpts[0][1]).values())
    assert not (tmp_path / "run" / "final").exists()


def test_gradient_guard_stops_on_a_finite_loss_with_non_finite_gradients(tmp_path):
    class BadGradients(SFTTrainer):
        calls = 0

        def compute_loss(self, model, batch, generator):
            BadGradients.calls += 1
            if BadGradients.calls == 1:  # the loss stays finite; on call 4 only its gradient turns infinite
                weight = next(p for p in model.parameters() if p.requires_grad)
                weight.register_hook(lambda g: g * float("inf") if BadGradients.calls == 4 else g)
            return super().compute_loss(model, batch, generator)

    cfg = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", save_every=2))
    with pytest.raises(TrainingDiverged) as err:
        BadGradients(cfg).run()
    msg = str(err.value)
    assert "non-finite gradient norm" in msg and "step 4" in msg and "step-0000002" in msg
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [2]


def test_resume_with_more_steps_follows_the_new_schedule(tmp_path):
    import csv

    from dllm.training.engine import LRSchedule

    SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "run", max_steps=4))).run()
    longer = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", max_steps=8, resume="true"))
    assert SFTTrainer(longer).run().step == 8
    rows = {int(r["step"]): float(r["lr"]) for r in csv.DictReader((tmp_path / "run" / "metrics.csv").open())}
    sched = LRSchedule("cosine", 2, 8, 0.1)
    for step in (6, 8):  # lr logged after `step` updates = base lr x schedule(step)
        assert abs(rows[step] - 1e-3 * sched(step)) < 1e-9


def test_resume_with_a_new_lr_and_schedule_uses_them(tmp_path):
    """The checkpoint restores the old base lr; the recipe's optim.lr / schedule must win on resume."""
    import csv

    SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "run", max_steps=4))).run()
    flat = load_config(SFTConfig, None, micro_overrides(tmp_path / "run", max_steps=7, resume="true",
                                                        **{"optim.lr": "2e-4", "optim.schedule": "constant"}))
    assert SFTTrainer(flat).run().step == 7
    rows = {int(r["step"]): float(r["lr"]) for r in csv.DictReader((tmp_path / "run" / "metrics.csv").open())}
    assert abs(rows[6] - 2e-4) < 1e-12 and abs(rows[7] - 2e-4) < 1e-12


def test_result_mask_run_and_a_bad_trigger_is_a_clean_cli_error(tmp_path):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    over = micro_overrides(tmp_path / "run", max_steps=3, **{"data.tasks": "{gsm: 1}", "data.max_new_tokens": 64,
                                                             "result_mask_prob": 1.0})
    result = SFTTrainer(load_config(SFTConfig, None, over)).run()
    assert result.status == "finished" and result.step == 3
    cut = micro_overrides(tmp_path / "cut", max_steps=2, **{"data.tasks": "{chain: 1}", "data.max_new_tokens": 256,
                                                            "result_cut_prob": 1.0})
    assert SFTTrainer(load_config(SFTConfig, None, cut)).run().step == 2
    bad = micro_overrides(tmp_path / "bad", result_cut_prob=0.5, result_triggers="[no-such-token]")
    res = CliRunner().invoke(train_app, ["sft", *bad])
    assert res.exit_code == 2 and "no trigger tokens" in res.output, res.output
    assert not (tmp_path / "bad" / "final").exists()


def test_missing_checkpoint_and_distill_without_path_are_clean_cli_errors(tmp_path):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    over = micro_overrides(tmp_path / "run", **{"model.path": str(tmp_path / "no-such-model")})
    res = CliRunner().invoke(train_app, ["sft", *over])
    assert res.exit_code == 2 and "no-such-model" in res.output and "Traceback" not in res.output, res.output
    res = CliRunner().invoke(train_app, ["distill", "--config", str(REPO / "recipes" / "smoke-distill.yaml"),
                                         "model.path=null", f"run_dir={tmp_path / 'd'}"])
    assert res.exit_code == 2 and "model.grow_from" in res.output, res.output


def test_folders_that_cannot_be_made_fail_before_training(tmp_path):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = CliRunner().invoke(train_app, ["sft", *micro_overrides(blocker / "run")])
    assert res.exit_code == 2 and "run_dir: cannot create" in res.output and "Traceback" not in res.output, res.output
    over = micro_overrides(tmp_path / "run", export_dir=str(blocker / "final"))
    res = CliRunner().invoke(train_app, ["sft", *over])
    assert res.exit_code == 2 and "export_dir: cannot create" in res.output, res.output
    assert not list((tmp_path / "run").glob("checkpoints/step-*"))  # refused before the first step


def test_smoke_recipe_runs_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # its tokenizer is named (tiny), not a path relative to the repository
    cfg = load_config(SFTConfig, REPO / "recipes" / "smoke-sft.yaml", ["max_steps=1", "num_threads=1",
                                                                       f"run_dir={tmp_path / 'run'}"])
    assert SFTTrainer(cfg).run().step == 1


_CPU_ACCELERATOR = """
import torch
from dllm.training.engine import make_accelerator
acc = make_accelerator("no")
acc.unwrap_model(acc.prepare(torch.nn.Linear(2, 2)))  # where accelerate imports DeepSpeed
print(acc.device.type)
"""


def test_a_cpu_run_prints_no_deepspeed_accelerator_warning():
    """With DeepSpeed installed, accelerate imports it on a CPU run, which then warned that it found no GPU."""
    import os
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "CUDA_VISIBLE_DEVICES")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    out = subprocess.run([sys.executable, "-c", _CPU_ACCELERATOR], capture_output=True, text=True, env=env,
                         cwd=str(REPO), check=True, timeout=120)
    assert out.stdout.strip().endswith("cpu")
    assert "Setting accelerator to CPU" not in out.stderr + out.stdout, out.stderr


def test_an_export_dir_that_would_replace_something_else_is_refused_before_training(tmp_path):
    from dllm.training.config import ConfigError

    run = tmp_path / "run"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    for export_dir, why in ((run, "holds the run folder"), (tmp_path, "holds the run folder"),
                            (run / "checkpoints" / "m", "inside the run's checkpoints"),
                            (tmp_path / "mine", "holds files but no model"),
                            (tmp_path / "mine" / "notes.txt", "is a file")):
        cfg = load_config(SFTConfig, None, micro_overrides(run, max_steps=2, export_dir=str(export_dir)))
        with pytest.raises(ConfigError, match=f"export_dir: .*{why}"):
            SFTTrainer(cfg).run()
        assert not list_checkpoints(run)  # refused before the first step
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
