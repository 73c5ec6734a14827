"""``make demo``: fast generation on the bundled models against vanilla decoding.

For a handful of held-out prompts of every task suite it prints each answer, whether it is
correct, the forwards and TPF, for three methods: ``vanilla`` (one token per forward) and
``threshold`` + dual cache on the bidirectional ``tiny`` model, and ``d2f`` on the block-causal
``tiny-d2f`` student; then the tokens/s ratio of each against vanilla, measured in this run.
Last, one long answer (a 9x9 Sudoku grid, 228 tokens) from the bundled ``tiny-long``, by
``vanilla`` and by ``threshold`` + dual cache, where caching and parallel filling decide the speed.
"""

from __future__ import annotations

import argparse
import time

import torch

METHODS = [  # (label, model name, overrides)
    ("vanilla", "tiny", {"strategy": "vanilla"}),
    ("threshold+dual", "tiny", {"strategy": "threshold", "cache": "dual", "threshold": 0.9}),
    ("d2f", "tiny-d2f", {"strategy": "d2f"}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", default="tiny", help="bidirectional model (bundled name or directory)")
    ap.add_argument("--tiny-d2f", default="tiny-d2f", help="block-causal model (bundled name or directory)")
    ap.add_argument("--tiny-long", default="tiny-long",
                    help="long-answer model (bundled name or directory; 'none' skips the long example)")
    ap.add_argument("--long-suite", default="sudoku9", help="the long example's suite")
    ap.add_argument("--per-suite", type=int, default=2, help="held-out prompts per suite")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from dllm.eval.tasks import get_suite, suite_names
    from dllm.loading import CheckpointError, load_model, resolve_model_path
    from dllm.text import generate_text, load_tokenizer_for

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    console = Console()
    names = {"tiny": args.tiny, "tiny-d2f": args.tiny_d2f}
    if args.tiny_long != "none":
        names["tiny-long"] = args.tiny_long
    models = {}
    try:
        for key, name in names.items():
            path = resolve_model_path(name)
            models[key] = (load_model(path), load_tokenizer_for(path))
    except CheckpointError as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    examples = [ex for s in suite_names() for ex in get_suite(s).examples("test", args.per_suite, seed=1)]
    totals = {label: {"tokens": 0, "forwards": 0, "seconds": 0.0, "correct": 0} for label, _, _ in METHODS}
    console.print(f"[bold]dllm demo[/bold]: {len(examples)} held-out prompts, torch threads = {torch.get_num_threads()}")
    for ex in examples:
        table = Table(title=escape(f"[{ex.suite}] {ex.prompt}"), title_justify="left", show_lines=False)
        for col in ("method", "answer", "ok", "forwards", "TPF"):
            table.add_column(col)
        suite = get_suite(ex.suite)
        for label, key, overrides in METHODS:
            model, tok = models[key]
            t0 = time.perf_counter()
            res = generate_text(model, tok, ex.prompt, **overrides)[0]
            dt = time.perf_counter() - t0
            ok = suite.score(ex, res.text).correct
            t = totals[label]
            t["tokens"] += res.generated_tokens
            t["forwards"] += res.num_forwards
            t["seconds"] += dt
            t["correct"] += int(ok)
            table.add_row(label, escape(res.text), "yes" if ok else "no", str(res.num_forwards), f"{res.tpf:.2f}")
        console.print(table)
    summary = Table(title="Summary (measured in this run)", title_justify="left")
    for col in ("method", "accuracy", "TPF", "tokens/s", "speed vs vanilla"):
        summary.add_column(col)
    base = totals["vanilla"]["tokens"] / max(totals["vanilla"]["seconds"], 1e-9)
    for label, _, _ in METHODS:
        t = totals[label]
        tps = t["tokens"] / max(t["seconds"], 1e-9)
        summary.add_row(label, f"{100 * t['correct'] / len(examples):.0f}%", f"{t['tokens'] / max(1, t['forwards']):.2f}",
                        f"{tps:.0f}", f"{tps / base:.2f}x")
    console.print(summary)
    if "tiny-long" in models:
        _long_example(console, *models["tiny-long"], get_suite(args.long_suite))
    return 0


LONG_METHODS = [("vanilla", {"strategy": "vanilla"}),
                ("threshold+dual", {"strategy": "threshold", "cache": "dual", "threshold": 0.9})]


def _long_example(console, model, tok, suite) -> None:
    """One held-out long answer by each of LONG_METHODS, with its partial credit and tokens/s."""
    from rich.markup import escape
    from rich.table import Table

    from dllm.text import generate_text

    ex = suite.examples("test", 1, seed=1)[0]
    table = Table(title=escape(f"Long answer [{ex.suite}] {ex.prompt}"), title_justify="left", show_lines=True)
    for col in ("method", "answer", "ok", "credit", "forwards", "TPF", "tokens/s"):
        table.add_column(col)
    speeds = {}
    for label, overrides in LONG_METHODS:
        t0 = time.perf_counter()
        res = generate_text(model, tok, ex.prompt, **overrides)[0]
        speeds[label] = res.generated_tokens / max(time.perf_counter() - t0, 1e-9)
        score = suite.score(ex, res.text)
        credit = ", ".join(f"{k.removesuffix('_accuracy')} {100 * v:.0f}%" for k, v in score.details.items()
                           if k.endswith("_accuracy"))
        table.add_row(label, escape(res.text), "yes" if score.correct else "no", credit, str(res.num_forwards),
                      f"{res.tpf:.2f}", f"{speeds[label]:.0f}")
    console.print(table)
    ratio = speeds["threshold+dual"] / max(speeds["vanilla"], 1e-9)
    console.print(f"long answer: threshold+dual is {ratio:.1f}x vanilla's tokens/s (measured in this run; "
                  f"reference answer: {escape(ex.answer)})")


if __name__ == "__main__":
    raise SystemExit(main())
