"""Training faults: signals (checkpoint, the exact resume command, exit codes 130/143), kill -9 during a step
and during a checkpoint write, a full disk (monkeypatched ENOSPC, and a real small tmpfs where the system
lets an unprivileged user namespace mount one), the run-folder lock, for SFT, distillation and GRPO runs.

A fault chain runs the real command in child processes (tests/training/fault_child.py injects each fault at
an exact step), each child started from the resume command the previous one printed, and the finished
run must be bit-identical (weights and AdamW states) to one never interrupted."""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dllm.testing import save_tiny_checkpoint
from dllm.training.checkpointing import list_checkpoints
from dllm.training.cli import command_line, signal_exit_code
from dllm.training.config import DistillConfig, SFTConfig, load_config
from dllm.training.distill import DistillTrainer
from dllm.training.grpo import GRPOTrainer
from dllm.training.grpo_config import load_grpo_config
from dllm.training.run_lock import RunLock, RunLocked, lock_path
from dllm.training.sft import SFTTrainer
from dllm.training.write_faults import WriteFailed

from .conftest import MICRO_MODEL, REPO, TOKENIZER_DIR, micro_overrides

CHILD = Path(__file__).with_name("fault_child.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def _child(fault: str, args: list[str], timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHILD), fault, "--", *args], cwd=REPO, env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def _resume_args(output: str) -> list[str]:
    """The arguments of the ``resume with:`` command a run printed (after ``dllm train``)."""
    lines = [line for line in output.splitlines() if "resume with: " in line]
    assert lines, output[-3000:]
    words = shlex.split(lines[-1].split("resume with: ", 1)[1])
    assert words[:2] == ["dllm", "train"] and words[-1] == "--resume", words
    return words[2:]


def _state(ckpt: Path) -> tuple[dict, dict]:
    weights = load_file(str(ckpt / "model.safetensors"))
    optim = torch.load(ckpt / "optimizer.bin", weights_only=False)["state"]
    return weights, optim


def _assert_bit_identical(a: Path, b: Path) -> None:
    (wa, oa), (wb, ob) = _state(a), _state(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert oa.keys() == ob.keys()
    for k, st in oa.items():
        assert all(torch.equal(v, ob[k][n]) for n, v in st.items() if torch.is_tensor(v))


# -- the runs of each trainer ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A micro bidirectional teacher (distillation) and a micro block-causal policy (GRPO)."""
    from dllm.modeling import LLaDAConfig, LLaDAModelLM
    from dllm.tokenization import load_tokenizer, special_token_ids

    root = tmp_path_factory.mktemp("fault-models")
    tok = load_tokenizer(TOKENIZER_DIR)
    torch.manual_seed(0)
    cfg = LLaDAConfig(vocab_size=len(tok), embedding_size=len(tok), rope_theta=10000.0, **special_token_ids(tok),
                      **MICRO_MODEL)
    LLaDAModelLM(cfg).save_pretrained(str(root / "teacher"))
    tok.save_pretrained(str(root / "teacher"))
    save_tiny_checkpoint(root / "policy", block_causal=True, block_size=4)
    return root


def _overrides(kind: str, run_dir: Path, models: Path, **extra) -> list[str]:
    if kind == "sft":
        return micro_overrides(run_dir, **{"max_steps": 8, "save_every": 2, **extra})
    if kind == "distill":
        base = {"run_dir": str(run_dir), "max_steps": 8, "batch_size": 4, "num_threads": 1, "log_every": 1,
                "save_every": 2, "progress": "false", "model.path": str(models / "teacher"), "block_size": 4,
                "data.tasks": "{arith: 1}", "data.max_new_tokens": 8, "data.chunk_size": 64, "optim.lr": "1e-3"}
    else:
        base = {"model.path": str(models / "policy"), "run_dir": str(run_dir), "max_steps": 8, "num_threads": 1,
                "progress": "false", "save_every": 2, "log_every": 1, "data.tasks": "{arith: 1}",
                "data.max_new_tokens": 8, "data.chunk_size": 32, "data.mix": "per_example",
                "rollout.group_size": 2, "rollout.prompts_per_step": 2, "rollout.threshold": 0.3,
                "filter.enabled": "false", "optim.lr": "1e-3", "optim.warmup_steps": 0, "batch_size": 16}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _load(kind: str, overrides: list[str]):
    if kind == "grpo":
        return GRPOTrainer(load_grpo_config(None, overrides))
    cls, trainer = (SFTConfig, SFTTrainer) if kind == "sft" else (DistillConfig, DistillTrainer)
    return trainer(load_config(cls, None, overrides))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "distill", "grpo"])
def test_a_chain_of_faults_resumes_bit_identically(kind, models, tmp_path, capfd):
    """SIGINT, SIGTERM, kill -9 while a checkpoint is written, kill -9 in a step, then the last resume: each
    run started from the previous one's resume command, the end identical to an uninterrupted run."""
    reference = _load(kind, _overrides(kind, tmp_path / "ref", models)).run()
    assert reference.status == "finished" and reference.step == 8
    run = tmp_path / "run"
    args = [kind, *_overrides(kind, run, models)]

    first = _child("sigint@1", args)  # SIGINT as step 2 starts: checkpoint after it, exit 130
    assert first.returncode == 130 == signal_exit_code("SIGINT"), first.stdout[-3000:]
    assert "interrupted by SIGINT at step 2" in first.stdout and "Traceback" not in first.stdout
    again = _resume_args(first.stdout)
    assert again == args + ["--resume"], "the resume command repeats the subcommand and every override"
    assert [s for s, _ in list_checkpoints(run)] == [2]

    second = _child("sigterm@3", again)
    assert second.returncode == 143 == signal_exit_code("SIGTERM"), second.stdout[-3000:]
    assert f"resumed from {run / 'checkpoints' / 'step-0000002'}" in second.stdout
    assert "interrupted by SIGTERM at step 4" in second.stdout and _resume_args(second.stdout) == again
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]

    third = _child("killsave@6", again)  # dies with optimizer.bin of step 6 half written
    assert third.returncode == -9, third.stdout[-3000:]
    partial = run / "checkpoints" / ".tmp-step-0000006"
    assert (partial / "model.safetensors").exists() and (partial / "optimizer.bin").exists()
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]  # the half-written one is not a checkpoint
    assert lock_path(run).exists()  # left by kill -9, taken over below

    fourth = _child("kill@6", again)  # resumes from 4, writes 6, dies in step 7 after its backward
    assert fourth.returncode == -9, fourth.stdout[-3000:]
    assert "took over" in fourth.stdout and "no longer running" in fourth.stdout
    assert not partial.exists()  # removed when the run started
    assert [s for s, _ in list_checkpoints(run)] == [4, 6]

    capfd.readouterr()
    last = _load(kind, again[1:-1] + ["resume=true"]).run()  # in this process: the kill -9 left a stale lock
    assert last.status == "finished" and last.step == 8
    assert "took over" in capfd.readouterr().err
    _assert_bit_identical(reference.checkpoint, last.checkpoint)
    assert not lock_path(run).exists() and not list((run / "checkpoints").glob(".tmp-*"))


# -- the resume command and exit codes ---------------------------------------------------------------------


def test_the_resume_command_repeats_every_override(monkeypatch):
    over = ["run_dir=runs/a b", "model.config={d_model: 32, n_layers: 1}", "optim.lr=3e-4", "resume=true",
            "data.tasks.gsm=2"]
    monkeypatch.setattr(sys, "argv", ["/venv/bin/dllm", "train", "sft"])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    text = command_line("sft", Path("recipes/smoke-sft.yaml"), over, resume=True)
    assert shlex.split(text) == ["dllm", "train", "sft", "--config", "recipes/smoke-sft.yaml", "run_dir=runs/a b",
                                 "model.config={d_model: 32, n_layers: 1}", "optim.lr=3e-4", "data.tasks.gsm=2",
                                 "--resume"]
    monkeypatch.setattr(sys, "argv", [str(REPO / "training" / "cli.py"), "sft"])
    assert command_line("sft", None, ["max_steps=3"], resume=False) == "python -m dllm.training.cli sft max_steps=3"
    # several processes: the launch command, as the launcher was started
    import dllm.training.launch as launch

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(launch, "parent_command", lambda: [
        "/venv/bin/python3", "/venv/bin/accelerate", "launch", "--cpu", "--num_processes", "2", "-m",
        "dllm.training.cli", "sft", "--config", "r.yaml", "optim.lr=1e-3"])
    assert command_line("sft", Path("r.yaml"), ["optim.lr=1e-3"], resume=True) == (
        "accelerate launch --cpu --num_processes 2 -m dllm.training.cli sft --config r.yaml optim.lr=1e-3 --resume")


def test_signal_exit_codes_are_the_shell_ones():
    assert (signal_exit_code("SIGINT"), signal_exit_code("SIGTERM")) == (130, 143)


def test_a_signal_before_the_first_step_exits_at_once(tmp_path, monkeypatch):
    """SIGTERM while the model loads: nothing to save, no step run, exit 143, the lock released."""
    import signal

    from typer.testing import CliRunner

    import dllm.training.cli as cli

    class SignalWhileLoading(SFTTrainer):
        def setup_models(self):
            os.kill(os.getpid(), signal.SIGTERM)
            super().setup_models()

    run = tmp_path / "run"
    monkeypatch.setattr(cli, "_trainer", lambda kind: SignalWhileLoading)
    res = CliRunner().invoke(cli.train_app, ["sft", *micro_overrides(run)])
    assert res.exit_code == 143, res.output
    assert "SIGTERM before the first step: nothing was trained and nothing saved" in res.output
    assert not list_checkpoints(run) and not lock_path(run).exists()


def test_a_signal_during_an_evaluation_ends_it_and_checkpoints(tmp_path, monkeypatch):
    """SIGTERM while the in-training evaluation runs: it stops before its next batch (no half-scored
    suite is logged), the step is checkpointed at once and the run exits 143."""
    import signal

    from typer.testing import CliRunner

    import dllm.training.cli as cli
    import dllm.training.probe as probe

    batches = []
    real_unmask = probe.greedy_unmask

    def counted(*args, **kw):
        batches.append(1)
        return real_unmask(*args, **kw)

    class SignalInEvaluation(SFTTrainer):
        def evaluate(self, accelerator, model, log, step):
            os.kill(os.getpid(), signal.SIGTERM)
            super().evaluate(accelerator, model, log, step)

    run = tmp_path / "run"
    monkeypatch.setattr(cli, "_trainer", lambda kind: SignalInEvaluation)
    monkeypatch.setattr(probe, "greedy_unmask", counted)
    res = CliRunner().invoke(cli.train_app, ["sft", *micro_overrides(run, eval_every=2, eval_examples=4)])
    assert res.exit_code == 143, res.output
    assert "SIGTERM: evaluation at step 2 stopped early; suites scored: none" in res.output
    assert batches == []  # not one batch decoded after the signal
    assert [s for s, _ in list_checkpoints(run)] == [2] and "interrupted by SIGTERM at step 2" in res.output


def test_an_evaluation_stops_between_suites_when_asked(tmp_path):
    from dllm.training.probe import evaluate
    from dllm.training.rollouts import evaluate_decoding

    asked = []

    def stop_after_one():
        asked.append(1)
        return len(asked) > 1

    model, tok = save_tiny_checkpoint(tmp_path / "m")
    scores = evaluate(model, tok, ["arith", "gsm"], 2, 8, should_stop=stop_after_one)
    assert list(scores) == ["arith"]  # gsm was not started; no mean over a partial evaluation
    asked.clear()
    from dllm.generation import DiffusionGenerationConfig

    cfg = DiffusionGenerationConfig(max_new_tokens=8, block_length=8, strategy="vanilla")
    res = evaluate_decoding(model, tok, ["arith", "gsm"], 2, cfg, should_stop=stop_after_one)
    assert set(res) == {"arith_acc", "arith_tpf"}


# -- a full disk ---------------------------------------------------------------------------------------------


def _enospc_on(monkeypatch, marker: str) -> None:
    """torch.save into a path containing ``marker`` writes half its bytes, then fails like a full disk."""
    import io

    original = torch.save

    def save(obj, f, *args, **kw):
        if marker in str(f):
            buf = io.BytesIO()
            original(obj, buf, *args, **kw)
            Path(f).write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return original(obj, f, *args, **kw)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("kind", ["sft", "distill", "grpo"])
def test_a_full_disk_during_a_checkpoint_keeps_the_last_good_one(kind, models, tmp_path, monkeypatch):
    run = tmp_path / "run"
    over = _overrides(kind, run, models, max_steps=6)
    _enospc_on(monkeypatch, ".tmp-step-0000004")
    with pytest.raises(WriteFailed) as err:
        _load(kind, over).run()
    msg = str(err.value)
    assert msg.startswith("disk full while writing checkpoint step-0000004") and "No space left on device" in msg
    assert f"the last complete checkpoint, {run / 'checkpoints' / 'step-0000002'}, is untouched" in msg
    assert [s for s, _ in list_checkpoints(run)] == [2]
    assert not list((run / "checkpoints").glob(".tmp-*")) and not lock_path(run).exists()
    monkeypatch.undo()
    ref = _load(kind, _overrides(kind, tmp_path / "ref", models, max_steps=6)).run()
    done = _load(kind, over + ["resume=true"]).run()
    assert done.status == "finished"
    _assert_bit_identical(ref.checkpoint, done.checkpoint)


def test_a_full_disk_during_the_export_is_one_message_and_resume_exports(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    run = tmp_path / "run"
    original = SFTTrainer.export

    def export(self, model, out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "model.safetensors").write_bytes(b"\0" * 1000)  # the start of a file, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out_dir / "model.safetensors"))

    monkeypatch.setattr(SFTTrainer, "export", export)
    res = CliRunner().invoke(train_app, ["sft", *micro_overrides(run, max_steps=4)])
    assert res.exit_code == 74, res.output
    assert "disk full while writing the export to" in res.output and "Traceback" not in res.output
    assert "step-0000004, is untouched" in res.output and "resume with: dllm train sft" in res.output
    assert not (run / ".tmp-final").exists() and not (run / "final").exists()
    monkeypatch.setattr(SFTTrainer, "export", original)
    res = CliRunner().invoke(train_app, ["sft", *micro_overrides(run, max_steps=4), "--resume"])
    assert res.exit_code == 0, res.output
    assert (run / "final" / "model.safetensors").exists()


def test_a_full_disk_while_logging_is_one_message(tmp_path, monkeypatch):
    from dllm.training import run_log

    def full(self, row):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))

    monkeypatch.setattr(run_log.CsvLog, "write", full)
    with pytest.raises(WriteFailed, match=r"disk full while writing the run's files to .*metrics.csv"):
        SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "run"))).run()
    assert not lock_path(tmp_path / "run").exists()


def test_a_failed_write_that_is_not_a_full_disk_says_what_failed(tmp_path, monkeypatch):
    from accelerate import Accelerator

    import dllm.training.checkpointing as ck

    def refuse(self, path, **kw):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(Accelerator, "save_state", refuse)
    with pytest.raises(WriteFailed, match=r"cannot write checkpoint step-0000002 to .*: Permission denied") as err:
        SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "run", save_every=2))).run()
    assert not err.value.disk_full and ck.list_checkpoints(tmp_path / "run") == []


def _tmpfs_available(mount: Path) -> bool:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            f"mount -t tmpfs -o size=64k tmpfs {shlex.quote(str(mount))}"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.slow
def test_a_real_full_disk_on_a_small_tmpfs(tmp_path):
    """A 700 KiB tmpfs (in an unprivileged user + mount namespace) holds one micro checkpoint but not two:
    the step-4 write fails with torch's own error, the run says "disk full" in one message, exits 74, and the
    step-2 checkpoint resumes bit-identically on a real disk."""
    mount, out = tmp_path / "mnt", tmp_path / "out"
    mount.mkdir()
    if not _tmpfs_available(mount):
        pytest.skip("unprivileged user namespaces cannot mount a tmpfs here (e.g. restricted by AppArmor)")
    run = mount / "run"
    over = micro_overrides(run, max_steps=8, save_every=2, keep_checkpoints=1)
    script = (f"mount -t tmpfs -o size=700k tmpfs {shlex.quote(str(mount))} || exit 99; "
              f"{shlex.quote(sys.executable)} -m dllm.training.cli sft {shlex.join(over)}; rc=$?; "
              f"cp -a {shlex.quote(str(run))} {shlex.quote(str(out))}; exit $rc")
    res = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=REPO, env=ENV,
                         text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    assert res.returncode == 74, res.stdout[-3000:]
    errors = [line for line in res.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: disk full while writing checkpoint step-0000004")
    assert "Traceback" not in res.stdout
    assert [s for s, _ in list_checkpoints(out)] == [2] and not list((out / "checkpoints").glob(".tmp-*"))
    # the copy on a real disk resumes (run_dir moved there) and ends where an uninterrupted run ends
    ref = SFTTrainer(load_config(SFTConfig, None, micro_overrides(tmp_path / "ref", max_steps=8, save_every=2,
                                                                   keep_checkpoints=1))).run()
    done = SFTTrainer(load_config(SFTConfig, None, micro_overrides(out, max_steps=8, save_every=2,
                                                                    keep_checkpoints=1, resume="true"))).run()
    _assert_bit_identical(ref.checkpoint, done.checkpoint)


# -- one trainer per run folder -----------------------------------------------------------------------------


def test_a_second_trainer_on_a_locked_run_dir_fails_at_once_naming_the_first(tmp_path):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    run = tmp_path / "run"
    holder = RunLock(run, "dllm train sft --config first.yaml")
    assert holder.acquire() is None
    try:
        res = CliRunner().invoke(train_app, ["sft", *micro_overrides(run)])
        assert res.exit_code == 75, res.output
        assert f"{run} is in use by pid {os.getpid()}" in res.output and "first.yaml" in res.output
        assert "Traceback" not in res.output and not (run / "config.yaml").exists()
        with pytest.raises(RunLocked):
            RunLock(run).acquire()  # a second lock in the same process is refused too (flock per open file)
    finally:
        holder.release()
    assert not lock_path(run).exists()
    assert SFTTrainer(load_config(SFTConfig, None, micro_overrides(run, max_steps=2))).run().status == "finished"


def test_a_stale_lock_from_a_dead_process_is_taken_over_with_a_note(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "run"
    run.mkdir()
    lock_path(run).write_text(f'{{"pid": {dead.pid}, "host": "h", "command": "dllm train sft old", '
                              '"started": "2026-12-05 10:00:00 UTC"}\n')
    assert SFTTrainer(load_config(SFTConfig, None, micro_overrides(run, max_steps=2))).run().status == "finished"
    err = capsys.readouterr().err
    assert f"took over {lock_path(run)} from pid {dead.pid} (dllm train sft old" in err and "no longer running" in err
    assert not lock_path(run).exists()


@pytest.mark.slow
def test_a_running_trainer_keeps_a_second_one_out(tmp_path):
    """Two real processes: the second ``dllm train`` on the same run_dir fails before it builds a model,
    naming the first; the first then stops on an external SIGTERM: a complete checkpoint, the exact resume
    command, exit 143, its lock gone, and the checkpoint resumes."""
    import signal as _signal
    import time

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "dllm.training.cli", "sft", *micro_overrides(run, max_steps=100000)]
    first = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        while not (run / "metrics.csv").exists():
            assert first.poll() is None and time.time() < deadline, first.stdout.read()
            time.sleep(0.2)
        t0 = time.time()
        second = subprocess.run(cmd, cwd=REPO, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                timeout=120)
        assert second.returncode == 75, second.stdout
        assert f"is in use by pid {first.pid}" in second.stdout and "sft" in second.stdout
        assert "parameters" not in second.stdout and time.time() - t0 < 30  # refused before any model was built
        first.send_signal(_signal.SIGTERM)
        out, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 143, out
    assert "SIGTERM: saved" in out and f"resume with: python -m dllm.training.cli {shlex.join(cmd[3:])} --resume" in out
    assert not lock_path(run).exists()
    (step, path), = list_checkpoints(run)
    assert step >= 1 and {"model.safetensors", "optimizer.bin"} <= {p.name for p in path.iterdir()}
    assert not list((run / "checkpoints").glob(".tmp*"))
    cfg = load_config(SFTConfig, None, micro_overrides(run, max_steps=step + 1, resume="true"))
    assert SFTTrainer(cfg).run().step == step + 1
