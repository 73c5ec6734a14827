"""``dllm train sft|distill|grpo --config RECIPE [key=value ...] [--resume]``, ``dllm train grpo-report`` and
``dllm train export-checkpoint|import-checkpoint`` (a resume point as safetensors + JSON), ``dllm train
export-model`` (a checkpoint's model folder), mounted by
``dllm.cli``; also ``python -m dllm.training.cli``.

Exit codes of a training command: 0 finished; 1 training diverged (a NaN/inf loss or gradient); 2 a config,
data or checkpoint mistake (one ``error:`` line); 74 a write failed (a full disk; EX_IOERR); 75 another
trainer holds the run folder (EX_TEMPFAIL); 130 / 143 stopped by SIGINT / SIGTERM (128 + the signal's number,
as shells report a process killed by it), after a checkpoint where the run had started its first step.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path

import typer

from dllm.cli_common import fail

train_app = typer.Typer(help="Train diffusion LMs: masked-diffusion SFT, D2F distillation and TPF-aware GRPO.",
                        no_args_is_help=True, add_completion=False)

_CONFIG = typer.Option(None, "--config", "-c", help="YAML recipe (e.g. recipes/tiny-sft.yaml, recipes/grpo-tiny.yaml)")
_RESUME = typer.Option(False, "--resume", help="continue the run in run_dir from its latest checkpoint")
_OVERRIDES = typer.Argument(None, help="key=value overrides with dotted keys, e.g. optim.lr=3e-4 data.tasks.gsm=2 "
                                                  "loss.beta=0")
_PRINT = typer.Option(False, "--print-config",
                      help="print the resolved config (recipe + overrides, every key) as YAML and exit")


def print_config(cfg) -> None:
    """The config as the run would use it, in the YAML a recipe is written in."""
    import yaml

    from .config import to_dict

    typer.echo(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())


EXIT_DIVERGED, EXIT_USAGE, EXIT_WRITE_FAILED, EXIT_LOCKED = 1, 2, 74, 75


def signal_exit_code(name: str) -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM (what a shell shows for a process it killed)."""
    return 128 + int(signal.Signals[name])


def _program() -> list[str]:
    """How this process was started, as the words before the subcommand: ``dllm train`` (the console
    script, ``python -m dllm``) or ``python -m dllm.training.cli``."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("dllm")
    if script.name == "cli.py" and script.parent.name == "training":
        return ["python", "-m", "dllm.training.cli"]
    return ["dllm", "train"]


def _launcher() -> list[str] | None:
    """The launch command of a multi-process run (``accelerate launch ...``, ``torchrun ...``), as the
    parent process was started, with the interpreter's path dropped; None for a single process."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    from .launch import parent_command

    cmd = parent_command()
    if len(cmd) > 1 and Path(cmd[0]).name.startswith("python"):
        cmd = ["python", *cmd[1:]] if cmd[1] == "-m" else [Path(cmd[1]).name, *cmd[2:]]
    return cmd if any(word in " ".join(cmd) for word in ("accelerate", "torch.distributed.run", "torchrun")) else None


def command_line(kind: str, config: Path | None, overrides: list[str], resume: bool) -> str:
    """The command that runs this training again: the launcher (several processes) or ``dllm train KIND``,
    the recipe and every override as typed, and ``--resume`` when asked for (``resume=...`` overrides are
    folded into it)."""
    launcher = _launcher()
    if launcher is not None:
        words = [w for w in launcher if w != "--resume" and not w.startswith("resume=")]
    else:
        words = [*_program(), kind]
        if config is not None:
            words += ["--config", str(config)]
        words += [o for o in overrides if o.split("=", 1)[0].strip().lstrip("-") != "resume"]
    return shlex.join(words + (["--resume"] if resume else []))


def _load(kind: str, config: Path | None, overrides: list[str]):
    from .kinds import load_kind_config

    return load_kind_config(kind, config, overrides)


def _trainer(kind: str):
    from .kinds import trainer_class

    return trainer_class(kind)


def _run(kind: str, config: Path | None, overrides: list[str] | None, resume: bool, show: bool = False) -> None:
    from dllm.errors import CheckpointError
    from dllm.eval.tasks.jsonl import DataFileError

    from .config import ConfigError
    from .engine import Interrupted, RunDirInUse, TrainingDiverged
    from .run_lock import RunLocked
    from .write_faults import WriteFailed

    overrides = list(overrides or [])
    resume = resume is True  # called as a plain function the default is typer's OptionInfo, which is truthy
    try:
        cfg = _load(kind, config, overrides + (["resume=true"] if resume else []))
    except ConfigError as err:
        fail(str(err))
    if show is True:
        print_config(cfg)
        return
    from .launch import start_missing_cpu_processes

    start_missing_cpu_processes()  # accelerate launch --cpu --num_processes N started only this process
    main = int(os.environ.get("RANK", "0") or 0) == 0  # one summary per run, not one per process
    again = command_line(kind, config, overrides, resume=True)
    try:
        trainer = _trainer(kind)(cfg)
        trainer.command = command_line(kind, config, overrides, resume=cfg.resume)
        result = trainer.run()
    except (ConfigError, CheckpointError, DataFileError, RunDirInUse) as err:  # found once the run reads its inputs
        fail(str(err))
    except RunLocked as err:
        fail(str(err), code=EXIT_LOCKED)
    except WriteFailed as err:
        fail(f"{err}\nresume with: {again}" if main else str(err), code=EXIT_WRITE_FAILED)
    except TrainingDiverged as err:
        fail(f"training diverged: {err}", code=EXIT_DIVERGED)
    except Interrupted as err:
        if main:
            typer.echo(f"interrupted: {err}", err=True)
        raise typer.Exit(signal_exit_code(err.signal)) from None
    if result.status == "interrupted":
        if main:
            typer.echo(f"interrupted by {result.signal} at step {result.step}; checkpoint {result.checkpoint}; "
                       f"resume with: {again}", err=True)
        raise typer.Exit(signal_exit_code(result.signal or "SIGINT"))
    if main:
        # the run's log has said why a run updated nothing; the last line must not read as a normal finish
        none = " without an update" if result.updates == 0 else ""
        typer.echo(f"finished at step {result.step}{none}; model: {result.export_dir}", err=True)


@train_app.command(context_settings={"allow_extra_args": False})
def sft(config: Path = _CONFIG, overrides: list[str] = _OVERRIDES, resume: bool = _RESUME,
        show: bool = _PRINT) -> None:
    """Masked-diffusion SFT (LLaDA objective; block diffusion for block-causal models)."""
    _run("sft", config, overrides, resume, show)


@train_app.command()
def distill(config: Path = _CONFIG, overrides: list[str] = _OVERRIDES, resume: bool = _RESUME,
            show: bool = _PRINT) -> None:
    """D2F asymmetric distillation: bidirectional teacher -> block-causal student."""
    _run("distill", config, overrides, resume, show)


@train_app.command(context_settings={"allow_extra_args": False})
def grpo(config: Path = _CONFIG, overrides: list[str] = _OVERRIDES, resume: bool = _RESUME,
         show: bool = _PRINT) -> None:
    """TPF-aware GRPO (LightningRL): rollouts through the decoder, accuracy + TPF rewards, PPO update."""
    _run("grpo", config, overrides, resume, show)


_TRAINED = typer.Argument(..., help="the GRPO model (e.g. runs/grpo-tiny/final)")
_BASE = typer.Option("tiny-d2f", "--base", help="the model GRPO started from (bundled name or directory)")
_RUN_DIR = typer.Option(None, "--run-dir", help="the GRPO run (metrics.csv, eval.csv) to plot curves from")
_SUITES = typer.Option(None, "--suites", help="comma list (default: the run's data.tasks)")
_N = typer.Option(100, "--n", help="held-out (test split) examples per suite")
_STRATEGIES = typer.Option("threshold,d2f", "--strategies", help="greedy decoders to measure")
_MAX_NEW = typer.Option(None, "--max-new-tokens", help="canvas length (default: the run's)")
_THRESHOLD = typer.Option(0.9, "--threshold", help="threshold (threshold) / skip_threshold (d2f)")
_THREADS = typer.Option(2, "--threads")
_OUT = typer.Option(Path("docs/results/grpo-tiny"), "--out", help="writes report.json, report.md, curves.png")


@train_app.command("grpo-report")
def grpo_report(
    trained: Path = _TRAINED,
    base: str = _BASE,
    run_dir: Path = _RUN_DIR,
    suites: str = _SUITES,
    n: int = _N,
    strategies: str = _STRATEGIES,
    max_new_tokens: int = _MAX_NEW,
    threshold: float = _THRESHOLD,
    threads: int = _THREADS,
    out: Path = _OUT,
) -> None:
    """Before/after accuracy and TPF on held-out prompts (greedy), plus the run's training curves."""
    import json

    import torch
    import yaml

    from dllm.cli_common import USER_ERRORS
    from dllm.decoding.registry import get_strategy
    from dllm.errors import CheckpointError
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer

    from .rollouts import evaluate_decoding

    torch.set_num_threads(threads)
    info = {}
    info_file = Path(trained) / "training_info.json"
    if info_file.exists():
        info = json.loads(info_file.read_text()).get("config", {})
    elif run_dir is not None and (Path(run_dir) / "config.yaml").exists():
        info = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    tasks = info.get("data", {}).get("tasks", {})
    suite_list = suites.split(",") if suites else [k for k, v in tasks.items() if float(v) > 0] or ["arith"]
    g = max_new_tokens or info.get("data", {}).get("max_new_tokens") or 64
    try:
        trained_path, base_path = resolve_model_path(trained), resolve_model_path(base)
    except CheckpointError as err:
        fail(str(err))
    try:  # before the evaluation: a report that cannot be written is lost with it
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        fail(f"cannot create {out}: {err.strerror or err}")
    try:
        tok = load_tokenizer(trained_path)
        rows: dict = {}
        for label, path in (("base", base_path), ("grpo", trained_path)):
            model = load_model(path)
            block = info.get("rollout", {}).get("block_length")
            if block is None:
                block = model.spec.block_size if model.is_block_causal else model.diffusion_generation_config.block_length
            if block and g % block:
                block = None
            for strategy in [s.strip() for s in strategies.split(",") if s.strip()]:
                cfg = model.diffusion_generation_config.replace(
                    strategy=strategy, temperature=0.0, max_new_tokens=g, block_length=block,
                    stop_at_eos=True, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                    **{get_strategy(strategy).threshold_option or "threshold": threshold})
                rows[(label, strategy)] = evaluate_decoding(model, tok, suite_list, n, cfg)
                typer.echo(f"{label:5s} {strategy:10s} acc {rows[(label, strategy)]['acc']:.3f} "
                           f"tpf {rows[(label, strategy)]['tpf']:.3f}", err=True)
    except USER_ERRORS as err:
        fail(str(err))
    lines = [(f"Held-out test prompts: {', '.join(suite_list)} ({n} each), greedy, max_new_tokens={g}, "
              f"threshold={threshold}."), "",
             "| decoder | model | accuracy | mean TPF | TPF (Σtokens/Σforwards) | TPF x | Δacc (points) |",
             "|---|---|---|---|---|---|---|"]
    for strategy in dict.fromkeys(s for _, s in rows):
        b = rows[("base", strategy)]
        for label in ("base", "grpo"):
            r = rows[(label, strategy)]
            lines.append(f"| {strategy} | {label} | {100 * r['acc']:.1f}% | {r['tpf']:.2f} | {r['tpf_ratio']:.2f} | "
                         f"{r['tpf'] / max(b['tpf'], 1e-9):.2f} | {100 * (r['acc'] - b['acc']):+.1f} |")
    per_suite = ["", "| decoder | model | " + " | ".join(f"{s} acc / TPF" for s in suite_list) + " |",
                 "|---|---|" + "---|" * len(suite_list)]
    for (label, strategy), r in rows.items():
        per_suite.append(f"| {strategy} | {label} | " + " | ".join(
            f"{100 * r[f'{s}_acc']:.1f}% / {r[f'{s}_tpf']:.2f}" for s in suite_list) + " |")
    text = "\n".join(lines + per_suite) + "\n"
    (out / "report.md").write_text(text)
    (out / "report.json").write_text(json.dumps({f"{k[0]}/{k[1]}": v for k, v in rows.items()}, indent=2) + "\n")
    typer.echo(text)
    if run_dir is not None:
        plot_curves(Path(run_dir), out / "curves.png")
        typer.echo(f"wrote {out / 'curves.png'}", err=True)


def plot_curves(run_dir: Path, png: Path) -> None:
    """Training curves of a GRPO run: rollout TPF / accuracy / kept ratio per RL step, held-out eval."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def read(name):
        path = run_dir / name
        return list(csv.DictReader(path.open())) if path.exists() else []

    def col(rows, key):
        pts = [(int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
        return [p[0] for p in pts], [p[1] for p in pts]

    metrics, evals = read("metrics.csv"), read("eval.csv")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key, label in (("tpf", "rollout TPF (T=1)"), ("accuracy", "rollout accuracy"), ("kept_ratio", "kept groups")):
        axes[0 if key == "tpf" else 1].plot(*col(metrics, key), label=label, alpha=0.8)
    for key in (k for k in (evals[0].keys() if evals else []) if k.endswith("/tpf")):
        axes[0].plot(*col(evals, key), "o-", label=f"held-out {key} (greedy)")
    for key in (k for k in (evals[0].keys() if evals else []) if k.endswith("/acc")):
        axes[1].plot(*col(evals, key), "o-", label=f"held-out {key} (greedy)")
    for key in ("kl", "clip_frac", "nll"):
        axes[2].plot(*col(metrics, key), label=key, alpha=0.8)
    for ax, title in zip(axes, ("TPF", "accuracy / kept ratio", "KL, clip fraction, NLL")):
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
    axes[2].set_yscale("symlog", linthresh=1e-3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)


_FROM_RUN = typer.Argument(..., help="a run folder (its latest checkpoint) or one checkpoints/step-N folder")
_PORTABLE_OUT = typer.Argument(..., help="the folder to write (replaced as a whole once complete)")
_STEP = typer.Option(None, "--step", help="that step's checkpoint of the run folder instead of the latest")


@train_app.command("export-checkpoint")
def export_checkpoint_cmd(run: Path = _FROM_RUN, out: Path = _PORTABLE_OUT, step: int = _STEP) -> None:
    """Write a checkpoint as safetensors + JSON, without pickles (to keep, share or track a resume point)."""
    from dllm.errors import CheckpointError

    from .portable_checkpoint import export_checkpoint

    try:
        written = export_checkpoint(run, out, step)
    except CheckpointError as err:
        fail(str(err))
    size = sum(p.stat().st_size for p in written.iterdir())
    typer.echo(f"wrote {written} ({size / 2**20:.1f} MiB)", err=True)


_POINT = typer.Argument(..., help="a folder written by `dllm train export-checkpoint`")
_INTO = typer.Argument(..., help="the run folder to continue in (must have no checkpoints yet)")


@train_app.command("import-checkpoint")
def import_checkpoint_cmd(point: Path = _POINT, run_dir: Path = _INTO) -> None:
    """Unpack an exported checkpoint into a run folder; continue it with the recipe and --resume."""
    from dllm.errors import CheckpointError

    from .portable_checkpoint import import_checkpoint

    try:
        written = import_checkpoint(point, run_dir)
    except CheckpointError as err:
        fail(str(err))
    typer.echo(f"wrote {written}; continue with: dllm train KIND --config RECIPE run_dir={run_dir} --resume",
               err=True)


_MODEL_OUT = typer.Argument(..., help="the model folder to write (replaced as a whole once complete)")


@train_app.command("export-model")
def export_model_cmd(run: Path = _FROM_RUN, out: Path = _MODEL_OUT, step: int = _STEP) -> None:
    """Write a checkpoint's model as the run would export it (weights, tokenizer, generation defaults), to
    score or keep it while the run goes on; the run's folder is not touched."""
    from dllm.errors import CheckpointError

    from .config import ConfigError
    from .model_export import export_checkpoint_model

    try:
        written = export_checkpoint_model(run, out, step)
    except (CheckpointError, ConfigError) as err:
        fail(str(err))
    typer.echo(f"wrote {written}; score it with: dllm bench --model {written} ...", err=True)


def main() -> None:
    train_app(prog_name="python -m dllm.training.cli")


if __name__ == "__main__":
    sys.exit(main())
