"""Multi-process launches on the CPU: ``accelerate launch --cpu --num_processes 2`` runs two ranks (accelerate's
own CPU launcher starts one), DeepSpeed's batch size is micro-batch x accumulation x world size, and a
2-process ZeRO-2 run works where DeepSpeed is installed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from dllm.training.engine import deepspeed_batch_geometry
from dllm.training.launch import launch_arguments, missing_cpu_processes, relaunch_command, requested_processes

REPO = Path(__file__).resolve().parents[2]
SMOKE_SFT = REPO / "recipes" / "smoke-sft.yaml"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_launch_command_is_read_from_the_parent():
    py, acc = "/venv/bin/python", "/venv/bin/accelerate"
    rest = ["--cpu", "--num_processes", "2", "-m", "dllm.training.cli", "sft", "--config", "r.yaml"]
    assert launch_arguments([py, acc, "launch", *rest]) == rest
    assert launch_arguments([py, "-m", "accelerate.commands.launch", *rest]) == rest
    assert launch_arguments([py, "/venv/bin/accelerate-launch", *rest]) == rest
    assert launch_arguments([py, "-m", "torch.distributed.run", "launch"]) is None
    assert requested_processes(rest) == (2, 1)
    assert requested_processes(["--cpu", "--num_processes=3", "train.py"]) == (3, 1)
    assert requested_processes(["--cpu", "train.py"]) == (None, 1)


def test_only_the_lone_process_of_a_cpu_launch_relaunches():
    cmd = ["/venv/bin/python", "/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "-m",
           "dllm.training.cli", "sft"]
    env = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}
    assert missing_cpu_processes(env, cmd) == 2
    assert missing_cpu_processes({**env, "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, cmd) is None  # already a rank
    assert missing_cpu_processes({k: v for k, v in env.items() if k != "MASTER_ADDR"}, cmd) is None  # 1 process
    assert missing_cpu_processes({**env, "ACCELERATE_USE_CPU": "False"}, cmd) is None  # a GPU launch
    assert missing_cpu_processes(env, ["/venv/bin/python", "train.py"]) is None  # not accelerate
    assert missing_cpu_processes(env, cmd[:5] + ["1"] + cmd[6:]) is None
    assert missing_cpu_processes(env, [*cmd[:4], "--num_machines", "2", *cmd[4:]]) is None  # several nodes
    run = relaunch_command(2, env, ["/x/training/cli.py", "sft", "--config", "r.yaml"], main_module="dllm.training.cli")
    assert run[1:] == ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                       "--master_port", "29555", "-m", "dllm.training.cli", "sft", "--config", "r.yaml"]
    assert relaunch_command(2, env, ["/venv/bin/dllm", "train", "sft"], main_module="")[-3:] == [
        "/venv/bin/dllm", "train", "sft"]


def test_deepspeed_batch_size_is_micro_batch_x_accumulation_x_world():
    assert deepspeed_batch_geometry(16, 1, 2, 1.0) == {
        "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "train_batch_size": 32,
        "gradient_clipping": 1.0}
    assert deepspeed_batch_geometry(4, 8, 8, 0)["train_batch_size"] == 256  # recipes/llada-8b-sft.yaml on 8 GPUs
    # the shipped DeepSpeed configs leave exactly these to the trainer
    for path in (REPO / "recipes" / "deepspeed").glob("*.json"):
        ds = json.loads(path.read_text())
        assert all(ds[k] == "auto" for k in deepspeed_batch_geometry(1, 1, 1, 1.0)), path
    for path in (REPO / "recipes" / "accelerate").glob("zero*.yaml"):
        conf = yaml.safe_load(path.read_text())
        assert (REPO / conf["deepspeed_config"]["deepspeed_config_file"]).exists(), path


def _launch(cmd, tmp_path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    for var in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU"):
        env.pop(var, None)
    return subprocess.run(cmd, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def _accelerate() -> list[str]:
    exe = Path(sys.executable).with_name("accelerate")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "accelerate.commands.launch"]


def _sft_args(run, max_steps: int = 2) -> list[str]:
    return ["-m", "dllm.training.cli", "sft", "--config", str(SMOKE_SFT), f"run_dir={run}", f"max_steps={max_steps}",
            "num_threads=1", "save_every=0"]


@pytest.mark.slow
def test_two_process_zero2_on_the_cpu(tmp_path):
    """The shipped ZeRO-2 config on 2 CPU processes (DeepSpeed's CPU accelerator, gloo), each with batch_size 8
    of a shared global batch (``shard_global_batch``): the losses of one plain process with batch_size 16."""
    import numpy as np

    pytest.importorskip("deepspeed", reason="DeepSpeed is optional: pip install --no-build-isolation deepspeed")
    common = ["log_every=1", "mixed_precision=no", "shard_global_batch=true"]
    acc = _accelerate()
    launch = [*acc, "launch"] if len(acc) == 1 else acc
    res = _launch([*launch, "--config_file", str(REPO / "recipes" / "accelerate" / "zero2-8gpu.yaml"),
                   "--num_processes", "2", "--main_process_port", str(_port()), *_sft_args(tmp_path / "run"),
                   "batch_size=8", *common], REPO)  # the accelerate config names the DeepSpeed JSON relative to the repository
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 of 2 (DEEPSPEED" in res.stderr and "rank 1 of 2 (DEEPSPEED" in res.stderr
    assert "2 steps x 16 examples" in res.stderr and (tmp_path / "run" / "final" / "model.safetensors").exists()
    one = _launch([sys.executable, *_sft_args(tmp_path / "one"), "batch_size=16", *common], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "run")
    assert [r["step"] for r in a] == [r["step"] for r in b] == ["1", "2"]
    for key in ("loss", "grad_norm"):
        want, got = np.array([float(r[key]) for r in a]), np.array([float(r[key]) for r in b])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=key)


def _metrics(run: Path) -> list[dict]:
    import csv

    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_two_processes_equal_one_process_at_the_same_global_batch(tmp_path):
    """``shard_global_batch=true``: ``accelerate launch --cpu --num_processes 2`` with batch_size 4 logs the losses and
    gradient norms, and exports the weights, of one process with batch_size 8 (grad_accum 2 in both: 16 examples
    per step), in fp32 within float rounding. Without it each process draws its own examples and masks."""
    import numpy as np
    from safetensors.numpy import load_file

    common = ["log_every=1", "eval_every=0", "mixed_precision=no", "grad_accum=2",
              "shard_global_batch=true", "model.config={d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 4, "
              "mlp_hidden_size: 64}"]
    one = _launch([sys.executable, *_sft_args(tmp_path / "one", max_steps=3), "batch_size=8", *common], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    acc = _accelerate()
    launch = [*acc, "launch"] if len(acc) == 1 else acc
    two = _launch([*launch, "--cpu", "--num_processes", "2", "--main_process_port", str(_port()),
                   *_sft_args(tmp_path / "two", max_steps=3), "batch_size=4", *common], tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0 of 2" in two.stderr and "rank 1 of 2" in two.stderr
    assert "3 steps x 16 examples" in two.stderr and "3 steps x 16 examples" in one.stderr
    assert two.stderr.count("finished at step 3") == 1  # one report, from the main process
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] == ["1", "2", "3"]
    for key in ("loss", "grad_norm", "tokens_seen"):
        want, got = np.array([float(r[key]) for r in a]), np.array([float(r[key]) for r in b])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=key)
    assert len({r["loss"] for r in a}) == 3  # the steps differ: the comparison is not of one constant
    wa = load_file(tmp_path / "one" / "final" / "model.safetensors")
    wb = load_file(tmp_path / "two" / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        np.testing.assert_allclose(wb[name], wa[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_sft_and_grpo_shard_a_global_batch():
    """The SFT loss is a mean over rows, so equal shares of the rows average to the global loss; GRPO weighs each
    process's rollouts by the global minibatch's counts; distillation's loss is a mean over the masked tokens of a
    micro-batch. GRPO refuses what it cannot share: refilling filtered groups, d1's per-process prompt masks, and
    a process's rollouts that are not whole generate chunks."""
    from dllm.training.config import ConfigError, DistillConfig, SFTConfig
    from dllm.training.distill import DistillTrainer
    from dllm.training.grpo import GRPOTrainer
    from dllm.training.grpo_config import load_grpo_config
    from dllm.training.sft import SFTTrainer

    assert SFTTrainer(SFTConfig(model={"path": "tiny"}, shard_global_batch=True)).cfg.shard_global_batch
    with pytest.raises(ConfigError, match="shard_global_batch=true: the distill trainer"):
        DistillTrainer(DistillConfig(model={"path": "tiny"}, shard_global_batch=True))
    grpo = ["model.path=tiny-d2f", "shard_global_batch=true", "rollout.max_refill_rounds=0"]
    assert GRPOTrainer(load_grpo_config(None, grpo)).cfg.shard_global_batch
    with pytest.raises(ConfigError, match="set rollout.max_refill_rounds=0"):
        load_grpo_config(None, grpo[:2])
    assert load_grpo_config(None, [*grpo[:2], "filter.enabled=false"]).shard_global_batch  # nothing to refill
    with pytest.raises(ConfigError, match="d1 estimator"):
        load_grpo_config(None, [*grpo, "loss.estimator=d1"])
    with pytest.raises(ConfigError, match="set rollout.batch_size to a divisor of 12"):
        load_grpo_config(None, [*grpo, "rollout.prompts_per_step=3", "rollout.group_size=4", "rollout.batch_size=8"])
    # ZeRO-2 shares a global batch too (the processes pad to equal numbers of backward passes); ZeRO-3 would
    # partition the weights the rollouts are generated from
    trainer = GRPOTrainer(load_grpo_config(None, grpo))
    trainer.is_deepspeed = True

    def zero(stage):
        return SimpleNamespace(num_processes=2, state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(
            deepspeed_config={"zero_optimization": {"stage": stage}})))

    trainer.check_accelerator(zero(2))
    with pytest.raises(ConfigError, match="ZeRO-3 partitions"):
        trainer.check_accelerator(zero(3))
