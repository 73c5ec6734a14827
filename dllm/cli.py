"""The ``dllm`` command: generate, bench, train, serve."""

from __future__ import annotations

import json
import sys

import typer

app = typer.Typer(help="dllm: fast, practical diffusion language models.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)


def _print_version(value: bool) -> None:
    if value:
        import torch
        import transformers

        from dllm import __version__

        typer.echo(f"dllm {__version__} (torch {torch.__version__}, transformers {transformers.__version__})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the versions of dllm, torch and transformers and exit."),
) -> None:
    """dllm: fast, practical diffusion language models."""


def _quiet_transformers() -> None:
    """No weight-loading progress bars or advisory warnings in command output (JSON must stay parseable)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


_mounted = False


def _mount_subcommands() -> None:
    """Attach the commands of the other packages (once; a missing optional extra just omits its command)."""
    global _mounted
    if _mounted:
        return
    _mounted = True
    try:
        from training.cli import train_app
    except ImportError:  # training extras missing: the command explains itself
        train_app = None
    if train_app is not None:
        try:
            from training.grpo_cli import grpo, grpo_report

            train_app.command("grpo")(grpo)
            train_app.command("grpo-report")(grpo_report)
        except ImportError:
            pass
        app.add_typer(train_app, name="train")
    try:
        from eval.bench_cli import bench
    except ImportError:
        bench = None
    if bench is not None:
        app.command("bench")(bench)
    app.command("lm-eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                             "help_option_names": []})(lm_eval_command)
    try:
        from serving.cli import serve
    except ImportError:
        serve = None
    if serve is not None:
        app.command("serve")(serve)


@app.command("generate")
def generate(
    prompt: str = typer.Argument(..., help="The user prompt (the model's chat template is applied); "
                                           "'-' reads one prompt per line from stdin."),
    model: str = typer.Option("tiny", "--model", "-m", help="tiny, tiny-d2f, or a local checkpoint directory."),
    strategy: str | None = typer.Option(None, help="Decoding strategy (default: the model's)."),
    cache: str | None = typer.Option(None, help="none, prefix or dual (bidirectional models)."),
    threshold: float | None = typer.Option(None, help="Confidence threshold (threshold strategy)."),
    block_length: int | None = typer.Option(None, "--block-length", help="Block size."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Cap on generated tokens."),
    steps: int | None = typer.Option(None, help="Total steps (vanilla / Dream algorithms)."),
    temperature: float | None = typer.Option(None, help="0 = greedy."),
    seed: int | None = typer.Option(None, help="Seed for sampling."),
    lopa_branches: int | None = typer.Option(None, "--lopa-branches", help="LoPA lookahead branches."),
    branch_parallel: int = typer.Option(1, "--branch-parallel",
                                        help="Evaluate LoPA branches on N local processes (torch.distributed)."),
    dtype: str | None = typer.Option(None, help="float32, bfloat16 or float16."),
    device: str | None = typer.Option(None, help="cpu, cuda, cuda:1, ..."),
    options: list[str] | None = typer.Option(None, "--set", "-s",
                                             help="Any generation option as KEY=VALUE, repeatable "
                                                  "(e.g. --set skip_threshold=0.7); the flags above win."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts per generate call (prompts from stdin)."),
    no_chat: bool = typer.Option(False, "--no-chat", help="Do not apply the chat template."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per prompt (one per line)."),
    stream: bool = typer.Option(False, "--stream", help="Print the answer as its tokens are committed "
                                                        "(prompts run one at a time)."),
) -> None:
    """Generate an answer and report forwards, tokens per forward (TPF) and speed."""
    from decoding.registry import StrategyError
    from dllm.generation.config import GenerationConfigError, parse_overrides
    from dllm.loading import CheckpointError, load_model, resolve_model_path
    from dllm.text import generate_text, load_tokenizer_for

    _quiet_transformers()
    flags = {k: v for k, v in dict(strategy=strategy, cache=cache, threshold=threshold, block_length=block_length,
                                    max_new_tokens=max_new_tokens, steps=steps, temperature=temperature,
                                    seed=seed, lopa_branches=lopa_branches).items() if v is not None}
    if prompt == "-":
        prompts = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
        if not prompts:
            _fail("no prompts on stdin (one per line)")
    else:
        prompts = [prompt]
    if batch_size < 1:
        _fail("--batch-size must be >= 1")
    if stream and (as_json or branch_parallel > 1):
        _fail("--stream prints plain text from one process; leave out --json and --branch-parallel")
    try:
        overrides = {**parse_overrides(options or []), **flags}
        path = resolve_model_path(model)
        m = load_model(path, dtype=dtype, device=device)
        tok = load_tokenizer_for(path)
        cfg = m.diffusion_generation_config
        if "max_new_tokens" in overrides and "block_length" not in overrides and cfg.block_length:
            if overrides["max_new_tokens"] % cfg.block_length:
                overrides["block_length"] = overrides["max_new_tokens"]
        if branch_parallel > 1:
            from decoding.branch_parallel import run_branch_parallel

            overrides.setdefault("strategy", "lopa")
            results = run_branch_parallel(path, prompts, cfg.replace(**overrides), world_size=branch_parallel,
                                          chat=not no_chat, dtype=dtype, device=device)
        elif branch_parallel < 1:
            raise ValueError("--branch-parallel must be >= 1")
        else:
            stop_strings = cfg.replace(**overrides).stop_strings  # a bad option fails before the first batch
            results = []
            if stream:
                for p in prompts:
                    [result] = generate_text(m, tok, p, chat=not no_chat, streamer=_terminal_stream(tok, stop_strings),
                                             **overrides)
                    _print_status(result)
                return
            for i in range(0, len(prompts), batch_size):
                results += generate_text(m, tok, prompts[i:i + batch_size], chat=not no_chat, **overrides)
    except (CheckpointError, GenerationConfigError, StrategyError, ValueError) as err:
        _fail(str(err))
        return
    strategy_name = cfg.replace(**overrides).strategy
    for result in results:
        tps = result.generated_tokens / result.seconds if result.seconds > 0 else float("inf")
        if as_json:
            payload = {"text": result.text, "num_forwards": result.num_forwards,
                       "generated_tokens": result.generated_tokens, "tpf": round(result.tpf, 4),
                       "seconds": round(result.seconds, 4), "tokens_per_second": round(tps, 2),
                       "finish_reason": result.finish_reason, "model": model, "strategy": strategy_name}
            typer.echo(json.dumps(payload))
        else:
            typer.echo(result.text)
            _print_status(result)


def _print_status(result) -> None:
    tps = result.generated_tokens / result.seconds if result.seconds > 0 else float("inf")
    typer.echo(f"[forwards={result.num_forwards} tokens={result.generated_tokens} tpf={result.tpf:.2f} "
               f"tokens/s={tps:.1f} finish={result.finish_reason}]")


def _terminal_stream(tokenizer, stop_strings):
    """A streamer that writes a row's committed text to stdout as the decoder commits it
    (``--stream``); text is held back only while a stop string could still cut it or it ends inside
    a character. Built here so that ``dllm --help`` does not import the decoding stack."""
    from decoding.streaming import BatchStreamer
    from serving.textstream import RowText

    class TerminalStream(BatchStreamer):
        def __init__(self) -> None:
            self.row = RowText(tokenizer, max_tokens=1 << 30, stop=tuple(stop_strings))

        def put_row(self, row: int, token_ids: list[int]) -> None:
            _write(self.row.add(token_ids))

        def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
            _write(self.row.finish(finish_reason) + "\n")

    return TerminalStream()


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


@app.command("info")
def info(
    model: str = typer.Argument("tiny", help="tiny, tiny-d2f, a checkpoint directory or a cached repo id."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Show a model without loading its weights: format, size, attention, special ids, decoding defaults."""
    from dllm.generation.config import DiffusionGenerationConfig, GenerationConfigError
    from dllm.loading import CheckpointError, check_checkpoint_dir, resolve_model_path, stored_parameter_count

    try:
        path = resolve_model_path(model)
        cfg = check_checkpoint_dir(path, allow_pickle=True)
        gen = DiffusionGenerationConfig.from_pretrained(path)
        parameters = stored_parameter_count(path)
    except (CheckpointError, GenerationConfigError, ValueError, OSError) as err:
        _fail(str(err))
        return
    block_causal = cfg.get("attention_policy") == "block_causal"
    defaults = DiffusionGenerationConfig().to_dict()
    facts = {
        "model": model,
        "path": str(path),
        "model_type": cfg.get("model_type"),
        "parameters": parameters,
        "attention": "block_causal" if block_causal else "bidirectional",
        "block_size": cfg.get("block_size") if block_causal else None,
        "context_length": cfg.get("max_sequence_length") or cfg.get("max_position_embeddings"),
        "vocab_size": cfg.get("vocab_size"),
        "mask_token_id": (gen.mask_token_id if gen and gen.mask_token_id is not None else cfg.get("mask_token_id")),
        "eos_token_id": (gen.eos_token_id if gen and gen.eos_token_id is not None else cfg.get("eos_token_id")),
        "chat_template": (path / "chat_template.jinja").exists()
        or "chat_template" in _json_or_empty(path / "tokenizer_config.json"),
        # the canvas shape and strategy, plus what generation_config.json changes from dllm's defaults
        "generation_defaults": {k: v for k, v in (gen.to_dict() if gen else defaults).items()
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
        elif key == "parameters" and value is not None:
            value = f"{value:,} ({value / 1e6:.2f}M)" if value < 1e9 else f"{value:,} ({value / 1e9:.2f}B)"
        typer.echo(f"{key:<{width}}  {value}")


def _json_or_empty(path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def lm_eval_command(ctx: typer.Context) -> None:
    """lm-evaluation-harness with the `dllm` model registered (arguments go to lm-eval unchanged)."""
    try:
        from eval.lm_eval_adapter import main as lm_eval_main
    except ImportError as err:
        _fail(str(err))
        return
    from decoding.registry import StrategyError
    from dllm.generation.config import GenerationConfigError
    from dllm.loading import CheckpointError

    # lm-eval reports a user's mistakes (unknown task or model name) as ValueError, and so do our
    # model_args checks: one line each, not a traceback.
    try:
        lm_eval_main(list(ctx.args))
    except (CheckpointError, GenerationConfigError, StrategyError, ValueError) as err:
        _fail(str(err))


def main() -> None:
    _mount_subcommands()
    app(prog_name="dllm")


if __name__ == "__main__":
    sys.exit(main())
