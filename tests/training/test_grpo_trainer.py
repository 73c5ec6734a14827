"""GRPOTrainer: one update lowers the loss, chunking does not change the gradient, dynamic sampling
refills up to its bound, resume is bit-identical, LoRA, and ``grpo(...)`` end to end on the smoke
recipe."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm.testing import save_tiny_checkpoint
from dllm.training.checkpointing import list_checkpoints
from dllm.training.config import ConfigError
from dllm.training.grpo import GRPOTrainer
from dllm.training.grpo_config import load_grpo_config
from dllm.training.rollouts import Rollouts, generate_rollouts

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "smoke-grpo.yaml"


def _lines(path: Path) -> list[str]:
    return Path(path).read_text().splitlines()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("grpo-model")
    save_tiny_checkpoint(d, block_causal=True, block_size=4)
    return d


def _overrides(ckpt, run_dir, **extra) -> list[str]:
    base = {
        "model.path": str(ckpt), "run_dir": str(run_dir), "max_steps": 3, "num_threads": 1, "progress": "false",
        "save_every": 0, "log_every": 1, "data.tasks": "{arith: 1}", "data.max_new_tokens": 8,
        "data.chunk_size": 32, "data.mix": "per_example", "rollout.group_size": 4, "rollout.prompts_per_step": 2,
        "rollout.threshold": 0.3, "filter.require_correct": "false", "optim.lr": "1e-3", "optim.warmup_steps": 0,
        "batch_size": 16,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _trainer(ckpt, tmp_path, **extra) -> GRPOTrainer:
    tr = GRPOTrainer(load_grpo_config(None, _overrides(ckpt, tmp_path / "run", **extra)))
    tr.setup_models()
    return tr


def _fixed_batch(tr: GRPOTrainer):
    from dllm.eval.tasks import get_suite

    exs = get_suite("arith").examples("train", 3, seed=5)
    ro = generate_rollouts(tr.model, tr.tokenizer, exs, 4, tr.rollout_config, seed=1, truncated_is_wrong=False)
    ro.correct = torch.tensor([i % 3 == 0 for i in range(len(ro))])  # explicit verifier flags (random model)
    assert float(ro.tpf.std()) > 0  # the speed objective has something to rank
    return tr.make_batch(ro, torch.device("cpu"))


@pytest.mark.parametrize("estimator", ["trajectory", "block_masked", "d1"])
def test_one_update_on_a_fixed_batch_lowers_the_loss(ckpt, tmp_path, estimator):
    tr = _trainer(ckpt, tmp_path, **{"loss.estimator": estimator, "loss.beta": 0.05, "loss.mu": 0.1})
    batch = _fixed_batch(tr)
    views = tr.make_views(batch, torch.Generator().manual_seed(0))
    old = tr.token_logprobs(tr.model, views, batch)
    ref = tr.reference_logprobs(views, batch)
    torch.testing.assert_close(old, ref)  # the reference is the initial policy
    rows = torch.arange(len(batch.rollouts))
    before = tr.minibatch_loss(tr.model, batch, views, rows, old, ref)
    assert before["kl_sum"] == pytest.approx(0.0, abs=1e-6) and before["nll_loss"] > 0
    opt = torch.optim.SGD([p for p in tr.model.parameters() if p.requires_grad], lr=1e-3)
    tr.model.train()
    tr.minibatch_loss(tr.model, batch, views, rows, old, ref, backward=lambda loss, last: loss.backward())
    opt.step()
    after = tr.minibatch_loss(tr.model, batch, views, rows, old, ref)
    assert after["loss"] < before["loss"] - 1e-4


def test_chunking_does_not_change_the_gradient(ckpt, tmp_path):
    tr = _trainer(ckpt, tmp_path, **{"loss.beta": 0.05})
    batch = _fixed_batch(tr)
    views = tr.make_views(batch, None)
    ref = tr.reference_logprobs(views, batch)
    rows = torch.arange(len(batch.rollouts))
    grads = []
    for chunk in (1, 7, 1000):
        tr.cfg.batch_size = chunk
        tr.model.zero_grad()
        calls = []

        def backward(loss, last, calls=calls):
            calls.append(last)
            loss.backward()

        stats = tr.minibatch_loss(tr.model, batch, views, rows, None, ref, backward=backward)
        assert calls[-1] and sum(calls) == 1
        grads.append(([p.grad.clone() for p in tr.model.parameters()], stats["loss"]))
    for g, loss in grads[1:]:
        assert loss == pytest.approx(grads[0][1], abs=1e-5)
        for a, b in zip(g, grads[0][0]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def _fake_rollouts(plan):
    """A generate_rollouts stand-in: call k returns groups with the given (correct, tpf) rows."""
    calls = []

    def fake(model, tokenizer, examples, group_size, gen_cfg, **kw):
        spec = plan[len(calls)]
        calls.append(len(examples))
        assert len(spec) == len(examples)
        n = len(examples) * group_size
        correct = torch.tensor([c for grp in spec for c in grp[0]], dtype=torch.bool)
        tpf = torch.tensor([t for grp in spec for t in grp[1]], dtype=torch.float64)
        return Rollouts(torch.ones(n, 3, dtype=torch.long), torch.ones(n, 3, dtype=torch.long),
                        torch.full((n, 8), 5, dtype=torch.long), torch.ones(n, 8, dtype=torch.long),
                        torch.full((n,), 8), torch.ones(n, dtype=torch.long), tpf, correct, correct.double(),
                        torch.arange(len(examples)).repeat_interleave(group_size), group_size,
                        ["arith"] * n, [""] * n, ["length"] * n)

    return fake, calls


def test_dynamic_sampling_refills_up_to_the_bound(ckpt, tmp_path, monkeypatch):
    import dllm.training.grpo as grpo_mod

    ok, flat, fast = ([1, 0], [2.0, 3.0]), ([1, 1], [2.0, 2.0]), ([0, 0], [1.0, 4.0])
    plan = [[ok, flat, fast, ok], [flat, ok], [ok]]  # keep 2 of 4, then 1 of the 2 refilled, then the last
    fake, calls = _fake_rollouts(plan)
    monkeypatch.setattr(grpo_mod, "generate_rollouts", fake)
    tr = _trainer(ckpt, tmp_path, **{"rollout.prompts_per_step": 4, "rollout.group_size": 2,
                                     "rollout.max_refill_rounds": 2, "filter.require_correct": "true"})
    from accelerate import Accelerator

    from dllm.training.grpo import GRPOState
    from dllm.training.rollouts import PromptStream

    state = GRPOState(PromptStream({"arith": 1}, 0, chunk_size=32), torch.Generator())
    batch, info = tr.collect(state, Accelerator(cpu=True))
    assert calls == [4, 2, 1]  # each refill round asks only for the groups still missing
    assert info["groups_kept"] == 4 and len(batch) == 8 and info["refill_rounds"] == 2
    assert info["kept_ratio"] == pytest.approx(4 / 7)
    assert batch.group.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # the bound: nothing passes -> 1 + max_refill_rounds rounds, then no batch
    fake, calls = _fake_rollouts([[fast, flat, fast, flat], [fast, flat, fast, flat], [fast, flat, fast, flat]])
    monkeypatch.setattr(grpo_mod, "generate_rollouts", fake)
    batch, info = tr.collect(state, Accelerator(cpu=True))
    assert calls == [4, 4, 4] and batch is None and info["groups_kept"] == 0
    # filter off: one round, everything kept
    tr.cfg.filter.enabled = False
    fake, calls = _fake_rollouts([[fast, flat, fast, flat]])
    monkeypatch.setattr(grpo_mod, "generate_rollouts", fake)
    batch, info = tr.collect(state, Accelerator(cpu=True))
    assert calls == [4] and len(batch) == 8


def test_no_kept_group_means_no_update(ckpt, tmp_path):
    over = _overrides(ckpt, tmp_path / "run", max_steps=2, **{"filter.require_correct": "true",
                                                              "rollout.max_refill_rounds": 1})
    result = GRPOTrainer(load_grpo_config(None, over)).run()  # a random model is never right
    w0 = load_file(str(ckpt / "model.safetensors"))
    w1 = load_file(str(result.export_dir / "model.safetensors"))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    rows = list(csv.DictReader(_lines(tmp_path / "run" / "metrics.csv")))
    assert [int(r["updates"]) for r in rows] == [0, 0] and [int(r["groups_sampled"]) for r in rows] == [4, 4]


def _weights(path: Path) -> dict:
    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("estimator", ["trajectory", "d1"])
def test_resume_is_bit_identical(ckpt, tmp_path, estimator):
    extra = {"save_every": 1, "filter.enabled": "false", "loss.ppo_epochs": 2, "loss.minibatches": 2,
             "loss.estimator": estimator, "loss.beta": 0.05}
    GRPOTrainer(load_grpo_config(None, _overrides(ckpt, tmp_path / "a", **extra))).run()

    class Crash(GRPOTrainer):
        def collect(self, state, accelerator):
            if state.step == 2:
                raise RuntimeError("simulated crash")
            return super().collect(state, accelerator)

    part = load_grpo_config(None, _overrides(ckpt, tmp_path / "b", **extra))
    with pytest.raises(RuntimeError, match="simulated crash"):
        Crash(part).run()
    assert [s for s, _ in list_checkpoints(tmp_path / "b")] == [1, 2]
    part.resume = True
    assert GRPOTrainer(part).run().step == 3
    a, b = (_weights(tmp_path / r / "checkpoints" / "step-0000003") for r in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], load_file(str(ckpt / "model.safetensors"))[k]) for k in a)  # it trained
    opt_a, opt_b = (torch.load(tmp_path / r / "checkpoints" / "step-0000003" / "optimizer.bin", weights_only=False)
                    for r in ("a", "b"))
    for k, st in opt_a["state"].items():
        assert all(torch.equal(v, opt_b["state"][k][n]) for n, v in st.items() if torch.is_tensor(v))
    cols = ("loss", "accuracy", "tpf", "kl", "clip_frac", "groups_kept")
    ra, rb = (list(csv.DictReader(_lines(tmp_path / r / "metrics.csv"))) for r in ("a", "b"))
    assert [[r[c] for c in cols] for r in ra] == [[r[c] for c in cols] for r in rb]


def test_lora_run_uses_the_base_as_reference_and_exports(ckpt, tmp_path):
    over = _overrides(ckpt, tmp_path / "run", max_steps=2, **{"lora.enabled": "true", "lora.r": 4,
                                                              "filter.enabled": "false", "loss.beta": 0.1})
    result = GRPOTrainer(load_grpo_config(None, over)).run()
    assert (result.export_dir / "adapter" / "adapter_config.json").exists()
    rows = list(csv.DictReader(_lines(tmp_path / "run" / "metrics.csv")))
    assert float(rows[0]["kl"]) == pytest.approx(0.0, abs=1e-6)  # step 1: policy == base
    assert float(rows[1]["kl"]) > 0.0
    from dllm.loading import load_model

    merged = load_model(result.export_dir)
    w0 = load_file(str(ckpt / "model.safetensors"))
    assert any(not torch.equal(w0[k], v) for k, v in merged.state_dict().items() if k in w0)


def test_config_errors(ckpt, tmp_path):
    with pytest.raises(ConfigError, match="loss.estimator"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, **{"loss.estimator": "exact"}))
    with pytest.raises(ConfigError, match="trajectory"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, **{"rollout.strategy": "lopa"}))
    with pytest.raises(ConfigError, match="grad_accum"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, grad_accum=2))
    with pytest.raises(ConfigError, match="group_size"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, **{"rollout.group_size": 1}))
    with pytest.raises(ConfigError, match="unknown config key"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, **{"rollout.bogus": 1}))
    with pytest.raises(ConfigError, match="evaluation.threshold"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, **{"evaluation.threshold": 1.5}))
    with pytest.raises(ConfigError, match=r"rollout.options: strategy 'threshold' does not read lopa_branches"):
        load_grpo_config(None, _overrides(ckpt, tmp_path, **{"rollout.options": "{lopa_branches: 2}"}))
    assert load_grpo_config(None, _overrides(ckpt, tmp_path, **{"rollout.options": "{min_p: 0.1}"})).rollout.options


def test_eval_threshold_is_separate_from_the_rollout_threshold(ckpt, tmp_path):
    """Rollouts may explore at a lower threshold than the held-out eval is judged at."""
    tr = _trainer(ckpt, tmp_path)  # rollout.threshold 0.3, no evaluation.threshold: the eval follows it
    assert tr.rollout_config.threshold == 0.3
    assert tr.eval_config("threshold").threshold == 0.3 and tr.eval_config("d2f").skip_threshold == 0.3
    tr = _trainer(ckpt, tmp_path, **{"evaluation.threshold": 0.9})
    assert tr.rollout_config.threshold == 0.3 and tr.rollout_config.temperature == 1.0
    th, d2f = tr.eval_config("threshold"), tr.eval_config("d2f")
    assert th.threshold == 0.9 and th.temperature == 0.0 and th.stop_at_eos
    assert d2f.strategy == "d2f" and d2f.skip_threshold == 0.9


def test_grpo_command_end_to_end_on_the_smoke_recipe(ckpt, tmp_path):
    """The smoke recipe through ``grpo(...)`` (the function ``dllm train grpo`` mounts), in < 30 s."""
    from dllm.training.cli import grpo

    run = tmp_path / "smoke"
    over = [f"model.path={ckpt}", f"run_dir={run}", "num_threads=1", "filter.require_correct=false",
            "rollout.threshold=0.3"]
    t0 = time.time()
    grpo(SMOKE, over, resume=False)
    elapsed = time.time() - t0
    assert elapsed < 30
    rows = list(csv.DictReader(_lines(run / "metrics.csv")))
    assert len(rows) == 3
    for col in ("reward", "accuracy", "tpf", "kept_ratio", "kl", "clip_frac", "nll", "loss", "groups_kept"):
        assert col in rows[0]
    assert any(int(r["updates"]) > 0 for r in rows)
    evals = list(csv.DictReader(_lines(run / "eval.csv")))
    assert [int(r["step"]) for r in evals] == [0, 3] and "threshold/tpf" in evals[0]
    assert (run / "tensorboard").is_dir() and list((run / "tensorboard").iterdir())
    from dllm.loading import load_model

    model = load_model(run / "final")
    assert model.is_block_causal and (run / "final" / "training_info.json").exists()
    # the typer wiring: options, overrides and --resume (a finished run resumes to "finished" at once)
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(grpo)
    res = CliRunner().invoke(app, ["--config", str(SMOKE), *over, "--resume"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["--config", str(SMOKE), *over])
    assert res.exit_code == 2 and "resume" in res.output
    res = CliRunner().invoke(app, ["--config", str(SMOKE), "loss.estimator=nope"])
    assert res.exit_code == 2 and "loss.estimator" in res.output


def test_report_before_after_and_curves(ckpt, tmp_path):
    from dllm.training.cli import grpo, grpo_report

    run = tmp_path / "run"
    grpo(SMOKE, [f"model.path={ckpt}", f"run_dir={run}", "num_threads=1", "filter.require_correct=false",
                 "max_steps=2", "eval_every=1"], resume=False)
    out = tmp_path / "report"
    grpo_report(run / "final", base=str(ckpt), run_dir=run, suites=None, n=3, strategies="threshold,d2f",
                max_new_tokens=None, threshold=0.9, threads=1, out=out)
    table = (out / "report.md").read_text()
    assert "| threshold | base |" in table and "| d2f | grpo |" in table and "arith acc / TPF" in table
    assert (out / "curves.png").stat().st_size > 1000


def test_report_user_errors_are_one_line(ckpt, tmp_path):
    from typer.testing import CliRunner

    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    out = tmp_path / "report"
    r = CliRunner().invoke(app, ["train", "grpo-report", str(tmp_path / "missing"), "--out", str(out)])
    assert r.exit_code == 2 and "neither a bundled name" in r.output and not out.exists()
    for args, msg in [(["--strategies", "warp"], "unknown strategy 'warp'"), (["--suites", "poetry"], "unknown suite")]:
        r = CliRunner().invoke(app, ["train", "grpo-report", str(ckpt), "--base", str(ckpt), "--n", "1",
                                           "--out", str(out), *args])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("name", ["smoke-grpo", "grpo-tiny", "grpo-8b", "grpo-tiny-acc"])
def test_recipes_load(name):
    cfg = load_grpo_config(REPO / "recipes" / f"{name}.yaml")
    assert cfg.rollout.temperature == 1.0 and cfg.rollout.strategy == "threshold"
    if name == "grpo-tiny":
        assert cfg.model.path == "tiny-d2f" and cfg.loss.estimator == "block_masked" and cfg.reward.tpf_weight == 2.0
        # explores below the threshold it is judged at (docs/rl.md, session 5)
        assert cfg.rollout.threshold == 0.7 and cfg.evaluation.threshold == 0.9
    if name == "grpo-tiny-acc":  # accuracy only, judged by the quality bar's decoder
        assert cfg.reward.tpf_weight == 0.0 and cfg.filter.tpf_range == 0.0
        assert cfg.evaluation.strategies == ["vanilla"] and cfg.data.max_new_tokens % cfg.rollout.block_length == 0


@pytest.mark.slow
def test_two_process_ddp_with_uneven_batches(ckpt, tmp_path):
    """2 gloo processes on the CPU. A tight TPF filter leaves one rank with nothing to train on in some
    steps: every rank must still run the same collectives (advantage statistics, zero-gradient
    all-reduce, guards), or gloo aborts / the run hangs."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "dllm.training.cli", "grpo", "--config", str(SMOKE), f"model.path={ckpt}", f"run_dir={run}",
           "num_threads=1", "filter.require_correct=false", "filter.tpf_range=0.45", "rollout.max_refill_rounds=0",
           "rollout.prompts_per_step=1", "rollout.threshold=0.3", "loss.minibatches=2", "max_steps=6",
           "eval_every=0", "save_every=0"]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = list(csv.DictReader(_lines(run / "metrics.csv")))
    assert len(rows) == 6 and (run / "final" / "model.safetensors").exists()
    assert "x 2 processes" in res.stderr


_EQUAL_GLOBAL_BATCH = ["num_threads=1", "filter.require_correct=false", "filter.tpf_range=0.45",
                       "rollout.max_refill_rounds=0", "rollout.threshold=0.3", "rollout.batch_size=4",
                       "loss.minibatches=2", "batch_size=8", "max_steps=3", "eval_every=0", "save_every=0",
                       "mixed_precision=no", "shard_global_batch=true", "optim.lr=1e-3"]
# what one process and two sharing its global batch log alike
_SHARED_METRICS = ("rollouts", "groups_sampled", "groups_kept", "accuracy", "tpf", "gen_tokens", "forwards",
                   "tpf_kept", "updates", "loss", "pg_loss", "nll_loss", "kl", "clip_frac", "nll", "ratio",
                   "grad_norm", "adv_abs")


def _grpo_run(launch: list[str], ckpt, run_dir, prompts: int, cpu_flag: bool = False):
    """``dllm.training.cli grpo`` on the equal-global-batch settings under ``launch`` (none: one process);
    ``cpu_flag``: set ACCELERATE_USE_CPU (torchrun's ranks read it; accelerate's DeepSpeed launch must not)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU"):
        env.pop(var, None)
    if cpu_flag:
        env["ACCELERATE_USE_CPU"] = "1"
    cmd = [sys.executable, *launch, "-m", "dllm.training.cli", "grpo", "--config", str(SMOKE), f"model.path={ckpt}",
           *_EQUAL_GLOBAL_BATCH, f"run_dir={run_dir}", f"rollout.prompts_per_step={prompts}"]
    res = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.fixture(scope="module")
def one_process_run(ckpt, tmp_path_factory):
    """One process with 4 prompts per step: the run that 2 processes with 2 prompts each must reproduce."""
    run = tmp_path_factory.mktemp("grpo-one") / "run"
    _grpo_run([], ckpt, run, 4)
    return run


def _port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _assert_same_metrics(one: Path, two: Path) -> None:
    import numpy as np

    a, b = list(csv.DictReader(_lines(one / "metrics.csv"))), list(csv.DictReader(_lines(two / "metrics.csv")))
    assert [r["step"] for r in a] == [r["step"] for r in b] == ["1", "2", "3"]
    assert all(r["updates"] == "2" for r in a) and len({r["groups_kept"] for r in a}) > 1  # the filter did filter
    for key in _SHARED_METRICS:
        want, got = np.array([float(r[key]) for r in a]), np.array([float(r[key]) for r in b])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=key)
    assert len({r["loss"] for r in a}) == 3  # the steps differ: the comparison is not of one constant


@pytest.mark.slow
def test_two_processes_equal_one_process_at_the_same_global_batch(ckpt, one_process_run, tmp_path):
    """``shard_global_batch=true``: 2 processes with 2 prompts each log the rollout metrics and losses, and export
    the weights, of one process with 4 prompts (fp32, within float rounding). The TPF filter keeps different
    numbers of groups on the two processes, 2 minibatches per step split the global batch unevenly, and
    micro-batches of 8 views give the processes different numbers of backward passes."""
    import numpy as np

    two = _grpo_run(["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", _port()], ckpt,
                    tmp_path / "two", 2, cpu_flag=True)
    assert "x 2 processes" in two.stderr
    _assert_same_metrics(one_process_run, tmp_path / "two")
    wa, wb = _weights(one_process_run / "final"), _weights(tmp_path / "two" / "final")
    assert wa.keys() == wb.keys()
    for name in wa:
        np.testing.assert_allclose(wb[name].numpy(), wa[name].numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    start = load_file(str(ckpt / "model.safetensors"))
    assert any(not torch.equal(start[k], wa[k]) for k in start if k in wa)  # the updates moved the weights


@pytest.mark.slow
def test_two_zero2_processes_equal_one_process_at_the_same_global_batch(ckpt, one_process_run, tmp_path):
    """The shipped ZeRO-2 config on 2 CPU processes (DeepSpeed's CPU accelerator, gloo) with 2 prompts each: the
    rollout metrics, losses and gradient norms of one plain process with 4 prompts. ZeRO-2 reduces gradients
    inside every backward pass and the processes keep different numbers of groups, so the one with fewer
    micro-batches pads with zero-loss passes (``GRPOTrainer.pad_backwards``); without them the run hangs."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is optional: pip install --no-build-isolation deepspeed")
    launch = ["-m", "accelerate.commands.launch", "--config_file", str(REPO / "recipes" / "accelerate" /
              "zero2-8gpu.yaml"), "--num_processes", "2", "--main_process_port", _port()]
    two = _grpo_run(launch, ckpt, tmp_path / "two", 2)
    assert "rank 1 of 2 (DEEPSPEED" in two.stderr
    _assert_same_metrics(one_process_run, tmp_path / "two")


def test_more_minibatches_than_rollouts_takes_no_empty_steps(ckpt, tmp_path):
    over = _overrides(ckpt, tmp_path / "run", max_steps=1, **{"filter.enabled": "false", "rollout.group_size": 2,
                                                              "rollout.prompts_per_step": 1, "loss.minibatches": 3})
    GRPOTrainer(load_grpo_config(None, over)).run()
    rows = list(csv.DictReader(_lines(tmp_path / "run" / "metrics.csv")))
    assert int(rows[0]["updates"]) == 2  # 2 rollouts: the third minibatch is empty and skipped


def _random_rollouts(seed: int, groups: int = 3, size: int = 4) -> Rollouts:
    """Rollouts with random verdicts, scores and speeds (no model: what the advantages read)."""
    g = torch.Generator().manual_seed(seed)
    n = groups * size
    lengths, forwards = torch.randint(1, 9, (n,), generator=g), torch.randint(1, 9, (n,), generator=g)
    ones = torch.ones(n, 8, dtype=torch.long)
    return Rollouts(ones[:, :3], ones[:, :3], ones, ones, lengths, forwards, lengths.double() / forwards,
                    torch.rand(n, generator=g) < 0.5, torch.rand(n, generator=g, dtype=torch.float64),
                    torch.arange(groups).repeat_interleave(size), size)


class _GlooAccelerator:
    """What ``batch_stats`` asks of accelerate: the process count, the device and a summing reduce."""

    num_processes, device = 2, torch.device("cpu")

    @staticmethod
    def reduce(t, reduction="sum"):
        import torch.distributed as dist

        assert reduction == "sum"
        dist.all_reduce(t)
        return t


def _grpo_for_advantages(norm: str = "batch") -> GRPOTrainer:
    return GRPOTrainer(load_grpo_config(None, ["model.path=tiny-d2f", "run_dir=unused",
                                               f"reward.advantage_norm={norm}"]))


def _advantage_worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        tr = _grpo_for_advantages()
        res = {}
        for case, rollouts in (("even", _random_rollouts(rank)), ("one empty", _random_rollouts(0) if rank == 0 else None)):
            stats = tr.batch_stats(rollouts, _GlooAccelerator())
            res[case] = (stats, None if rollouts is None else tr.compute_advantages(rollouts, stats)[0])
        torch.save(res, Path(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_processes_gather_the_batch_statistics_of_the_advantages(tmp_path, monkeypatch):
    """``reward.advantage_norm=batch`` over 2 gloo processes, each with its own rollouts: the (sum, sum of squares,
    count) of the combined rewards are gathered from both, and each process's advantages equal, row for row, one
    process's over all the rollouts (also when one process has none). The rollouts themselves are drawn per
    process (prompts and sampling seeds depend on the rank), so a GRPO run is not compared with one process."""
    import torch.multiprocessing as mp

    monkeypatch.syspath_prepend(str(REPO))  # the spawned workers import this module by its name under tests/
    init = Path(tmp_path, "store").resolve().as_uri()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_advantage_worker, args=(r, init, str(tmp_path)), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    got = [torch.load(Path(tmp_path, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    tr = _grpo_for_advantages()
    everything = Rollouts.cat([_random_rollouts(0), _random_rollouts(1)], 0)
    want, combined = tr.compute_advantages(everything, None)  # one process: the batch is all there is
    assert float(want.std()) > 0.5
    for rank in range(2):
        stats, adv = got[rank]["even"]
        assert stats[2] == 24
        assert stats[0] == pytest.approx(float(combined.sum())) and stats[1] == pytest.approx(float((combined ** 2).sum()))
        torch.testing.assert_close(adv, want[12 * rank: 12 * (rank + 1)], rtol=1e-12, atol=1e-12)
    alone, _ = tr.compute_advantages(_random_rollouts(0), None)
    assert got[0]["one empty"][0] == got[1]["one empty"][0] and got[0]["one empty"][0][2] == 12
    torch.testing.assert_close(got[0]["one empty"][1], alone, rtol=1e-12, atol=1e-12)
    # the per-process normalisation would differ: the gathering is what makes them equal
    assert not torch.allclose(tr.compute_advantages(_random_rollouts(1), None)[0], want[12:])
