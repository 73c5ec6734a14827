"""The ``dllm`` command. Each package mounts its own commands: ``generate`` (dllm.decoding.cli), ``bench`` and
``lm-eval`` (dllm.eval.cli), ``serve`` (dllm.serving.cli), ``train`` (dllm.training.cli); ``info`` is here."""

from __future__ import annotations

import dataclasses
import json
import sys

import typer

from dllm.cli_common import USER_ERRORS, fail
from dllm.decoding.cli import generate
from dllm.eval.cli import bench, lm_eval_command

app = typer.Typer(help="dllm: fast, practical diffusion language models.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)


def _print_version(value: bool) -> None:
    if value:
        import torch
        import transformers

        from dllm.version import __version__

        typer.echo(f"dllm {__version__} (torch {torch.__version__}, transformers {transformers.__version__})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the versions of dllm, torch and transformers and exit."),
) -> None:
    """dllm: fast, practical diffusion language models."""


app.command("generate")(generate)
app.command("bench")(bench)
app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                         "help_option_names": []})(lm_eval_command)
_mounted = False


def _mount_subcommands() -> None:
    """Attach the commands that need optional extras (once; a missing extra just omits its command)."""
    global _mounted
    if _mounted:
        return
    _mounted = True
    try:
        from dllm.training.cli import train_app
    except ImportError:  # training extras missing
        train_app = None
    if train_app is not None:
        app.add_typer(train_app, name="train")
    try:
        from dllm.serving.cli import serve
    except ImportError:  # serving extras missing
        serve = None
    if serve is not None:
        app.command("serve")(serve)


@app.command("info")
def info(
    model: str = typer.Argument("tiny", help="tiny, tiny-d2f, tiny-long, tiny-long-d2f, a checkpoint directory or a cached repo id."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show a model without loading its weights: format, size, attention, special ids, decoding defaults."""
    from dllm.decoding.config import DiffusionGenerationConfig
    from dllm.loading import check_checkpoint_dir, resolve_model_path, stored_parameter_count

    try:
        path = resolve_model_path(model)
        cfg = check_checkpoint_dir(path, allow_pickle=True)
        gen = DiffusionGenerationConfig.from_pretrained(path)
        parameters = stored_parameter_count(path)
    except (*USER_ERRORS, OSError) as err:
        fail(str(err))
        return
    from dllm.modeling import family_of

    family = family_of(cfg)
    block_causal = cfg.get("attention_policy", family.attention) == "block_causal"
    block_size = cfg.get("block_size")
    experts = None
    try:  # the format's own reading of its config (Fast-dLLM v2 calls its block bd_size)
        config = family.config_class.from_dict(cfg)
        spec = config.core_spec()
        block_causal, block_size = spec.attention_policy == "block_causal", spec.block_size
        if hasattr(config, "expert_layout"):  # a mixture-of-experts format (None: no MoE layer in this config)
            experts = config.expert_layout()
    except Exception:  # noqa: BLE001 - info describes what it can; loading reports config errors
        spec = None
    defaults = DiffusionGenerationConfig().to_dict()
    facts = {
        "model": model,
        "path": str(path),
        "family": family.name,
        "architecture": family.architecture,
        "model_type": cfg.get("model_type"),
        "parameters": parameters,
        **({} if experts is None else {
            "experts": dataclasses.asdict(experts),
            "active_parameters": None if parameters is None else parameters - experts.idle_parameters}),
        "attention": "block_causal" if block_causal else "bidirectional",
        "logits": family.logits,
        "block_size": block_size if block_causal else None,
        "blocks_from": (getattr(spec, "block_alignment", "prompt") == "position" and "position 0"
                        or "the prompt end") if block_causal else None,
        "context_length": cfg.get("max_sequence_length") or cfg.get("max_position_embeddings"),
        "vocab_size": cfg.get("vocab_size"),
        "mask_token_id": (gen.mask_token_id if gen and gen.mask_token_id is not None
                          else cfg.get("mask_token_id", family.mask_token_id)),
        "eos_token_id": (gen.eos_token_id if gen and gen.eos_token_id is not None
                         else _json_or_empty(path / "generation_config.json").get("eos_token_id")
                         or cfg.get("eos_token_id")),
        "chat_template": (path / "chat_template.jinja").exists()
        or "chat_template" in _json_or_empty(path / "tokenizer_config.json"),
        # the canvas shape and strategy, plus what generation_config.json changes from dllm's defaults
        "generation_defaults": {k: v for k, v in (gen or _family_defaults(family, block_causal, block_size, spec)
                                                  or DiffusionGenerationConfig()).to_dict().items()
                                if k in ("strategy", "max_new_tokens", "block_length")
                                or (v != defaults.get(k) and not k.endswith("_token_id"))},
        "model_card": str(path / "README.md") if (path / "README.md").exists() else None,
    }
    if as_json:
        typer.echo(json.dumps(facts))
        return
    width = max(map(len, facts))
    for key, value in facts.items():
        if key == "generation_defaults":
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        elif key in ("parameters", "active_parameters") and value is not None:
            value = f"{value:,} ({value / 1e6:.2f}M)" if value < 1e9 else f"{value:,} ({value / 1e9:.2f}B)"
        elif key == "experts":
            value = str(experts)
        typer.echo(f"{key:<{width}}  {value}")


def _family_defaults(family, block_causal: bool, block_size, spec):
    """What ``model.generate`` uses for a checkpoint without dllm's decoding defaults (the model's
    ``default_decoding``, read without loading the weights)."""
    from dllm.decoding.config import DiffusionGenerationConfig

    fields = {"strategy": "d2f" if block_causal else "threshold",
              **getattr(family.model_class, "family_decoding", {})}
    if block_causal and getattr(spec, "block_alignment", "prompt") == "position":
        fields["block_length"] = block_size
    try:
        return DiffusionGenerationConfig(**fields)
    except Exception:  # noqa: BLE001
        return None


def _json_or_empty(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> None:
    _mount_subcommands()
    app(prog_name="dllm")


if __name__ == "__main__":
    sys.exit(main())
