"""``dllm bench`` (strategies side by side on the task suites) and ``dllm lm-eval`` (mounted by ``dllm.cli``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import typer

from dllm.cli_common import USER_ERRORS, fail, quiet_transformers


def bench(
    model: str = typer.Option("tiny-d2f", "--model", "-m", help="tiny, tiny-d2f, tiny-long, tiny-long-d2f, or a checkpoint directory."),
    suite: str = typer.Option("all", "--suite", help="arith, gsm, lists, sudoku, countdown (all: these five); the "
                                                              "long-answer sudoku9, longlists, chain (long); a JSON Lines "
                                                              "file of your own (my.jsonl, exact match); a comma list; every. "
                                                              "A suite's options follow a colon: sudoku9:blanks=40, "
                                                              "longlists:max_items=16,ops=sort+dedupe."),
    strategies: str = typer.Option("vanilla,threshold,d2f", "--strategies",
                                   help="Comma list; parameters as name:key=value,key=value (e.g. threshold:cache=dual,threshold=0.9)."),
    n: int = typer.Option(20, "--n", help="Held-out examples per suite."),
    sweep: str | None = typer.Option(None, "--sweep", help="key=v1,v2,...: run every non-baseline method per value."),
    batch_size: int = typer.Option(1, "--batch-size", help="Prompts per generate call."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens"),
    block_length: int | None = typer.Option(None, "--block-length"),
    threads: int = typer.Option(2, "--threads", help="torch CPU threads (fixed and reported)."),
    dtype: str | None = typer.Option(None, help="float32, bfloat16 or float16."),
    device: str | None = typer.Option(None, help="cpu, cuda, ..."),
    seed: int = typer.Option(0, "--seed", help="Seed of the held-out sample."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report here."),
    plot: Path | None = typer.Option(None, "--plot", help="Write an accuracy-vs-TPF Pareto chart (PNG)."),
    samples: Path | None = typer.Option(None, "--samples",
                                        help="Write every answer here (JSON Lines: one line per problem and "
                                             "strategy, with its prompt, reference, completion and score)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
    by_category: bool = typer.Option(False, "--by-category",
                                     help="Also print accuracy per problem category (list op, arith operator and "
                                          "width, gsm and chain steps, sudoku blanks, sudoku9 rounds); always in --json."),
    by_length: bool = typer.Option(False, "--by-length",
                                   help="Also print accuracy and TPF per quarter of each suite's problems by the "
                                        "length of their reference answer (tokens); always in --json."),
) -> None:
    """Run decoding strategies side by side on the same prompts and print accuracy, TPF, NFE, speed and AUP."""
    import torch

    from dllm.loading import load_model, resolve_model_path
    from dllm.text import load_tokenizer_for

    from .bench import (
        BenchInterrupted,
        BenchSpecError,
        apply_sweep,
        format_categories,
        format_lengths,
        format_table,
        pareto_plot,
        parse_methods,
        run_bench,
    )
    from .outputs import IMAGE_FORMATS, OutputPathError, prepare_output_file
    from .tasks import resolve_suites

    if n < 1:
        fail("--n must be >= 1")
    if batch_size < 1:
        fail("--batch-size must be >= 1")
    if threads < 1:
        fail("--threads must be >= 1")
    for flag, out, formats in (("--plot", plot, IMAGE_FORMATS), ("--json", json_out, None),
                               ("--samples", samples, ("jsonl",))):
        try:  # before the run: a report that cannot be written is lost with it
            if out is not None:
                prepare_output_file(out, formats)
        except OutputPathError as err:
            fail(f"{flag} {err}")
    quiet_transformers()
    torch.set_num_threads(threads)
    overrides = {k: v for k, v in {"max_new_tokens": max_new_tokens, "block_length": block_length}.items() if v}
    try:
        methods = apply_sweep(parse_methods(strategies), sweep)
        resolve_suites(suite)  # a bad suite name or data file fails before the model loads
        path = resolve_model_path(model)
        m = load_model(path, dtype=dtype, device=device)
        tok = load_tokenizer_for(path)
        with contextlib.ExitStack() as stack:
            on_sample, sinks = None, []
            if samples is not None:  # a line per answer as its batch is counted: an interrupt keeps them

                def on_sample(record: dict) -> None:
                    if not sinks:  # opened with the first answer: a run that fails first leaves no file
                        sinks.append(stack.enter_context(samples.open("w")))
                    sinks[0].write(json.dumps(record, default=str) + "\n")
                    sinks[0].flush()

            report = run_bench(m, tok, suites=suite, methods=methods, n=n, batch_size=batch_size,
                               seed=seed, base_overrides=overrides, progress=not no_progress, on_sample=on_sample)
    except (BenchSpecError, *USER_ERRORS) as err:
        fail(str(err))
        return
    except BenchInterrupted as stop:
        if stop.report is None:
            typer.echo("interrupted before every strategy had finished one batch; nothing to report", err=True)
            raise typer.Exit(130) from None
        report = stop.report
        done = report["interrupted"]
        typer.echo(f"interrupted: partial results over the first {done['examples_done']} of "
                   f"{done['examples_planned']} prompts, which every strategy finished", err=True)
    report["model"] = model
    typer.echo(format_table(report))
    if by_category and format_categories(report):
        typer.echo("")
        typer.echo(format_categories(report))
    if by_length and format_lengths(report):
        typer.echo("")
        typer.echo(format_lengths(report))
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        typer.echo(f"wrote {json_out}")
    if plot:
        pareto_plot(report, str(plot))
        typer.echo(f"wrote {plot}")
    if samples:
        typer.echo(f"wrote {samples}")
    if "interrupted" in report:
        raise typer.Exit(130)


def lm_eval_command(ctx: typer.Context) -> None:
    """lm-evaluation-harness with the `dllm` model registered (arguments go to lm-eval unchanged)."""
    try:
        from .lm_eval_adapter import main as lm_eval_main
    except ImportError as err:
        fail(str(err))
        return

    # lm-eval reports a user's mistakes (unknown task or model name) as ValueError, and so do our
    # model_args checks: one line each, not a traceback.
    try:
        lm_eval_main(list(ctx.args))
    except USER_ERRORS as err:
        fail(str(err))
