"""``dllm train sft|distill --config RECIPE [key=value ...] [--resume]`` (also ``python -m training.cli``)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

train_app = typer.Typer(help="Train diffusion LMs: masked-diffusion SFT, D2F distillation and TPF-aware GRPO.",
                        no_args_is_help=True, add_completion=False)

_CONFIG = typer.Option(None, "--config", "-c", help="YAML recipe (e.g. recipes/tiny-sft.yaml)")
_RESUME = typer.Option(False, "--resume", help="continue the run in run_dir from its latest checkpoint")
_OVERRIDES = typer.Argument(None, help="key=value overrides with dotted keys, e.g. optim.lr=3e-4 data.tasks.gsm=2")
_PRINT = typer.Option(False, "--print-config",
                      help="print the resolved config (recipe + overrides, every key) as YAML and exit")


def print_config(cfg) -> None:
    """The config as the run would use it, in the YAML a recipe is written in."""
    import yaml

    from .config import to_dict

    typer.echo(yaml.safe_dump(to_dict(cfg), sort_keys=False).rstrip())


def _run(kind: str, config: Path | None, overrides: list[str] | None, resume: bool, show: bool = False) -> None:
    from .config import ConfigError, DistillConfig, SFTConfig, load_config
    from .engine import RunDirInUse, TrainingDiverged

    cls = SFTConfig if kind == "sft" else DistillConfig
    try:
        cfg = load_config(cls, config, list(overrides or []) + (["resume=true"] if resume else []))
    except ConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if show is True:  # called as a plain function the default is typer's OptionInfo, which is truthy
        print_config(cfg)
        return
    if kind == "sft":
        from .sft import SFTTrainer as trainer_cls
    else:
        from .distill import DistillTrainer as trainer_cls
    from dllm.loading import CheckpointError
    from eval.tasks.jsonl import DataFileError

    try:
        result = trainer_cls(cfg).run()
    except (ConfigError, CheckpointError, DataFileError) as err:  # found only once the run reads its inputs
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except TrainingDiverged as err:
        typer.echo(f"error: training diverged: {err}", err=True)
        raise typer.Exit(1) from None
    except RunDirInUse as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if result.status == "interrupted":
        typer.echo(f"interrupted at step {result.step}; checkpoint {result.checkpoint}; "
                   f"resume with: --config {config} --resume", err=True)
    else:
        typer.echo(f"finished at step {result.step}; model: {result.export_dir}", err=True)


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


def main() -> None:
    train_app(prog_name="dllm train")


if __name__ == "__main__":
    sys.exit(main())
