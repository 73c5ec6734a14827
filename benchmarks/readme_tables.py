"""Regenerate the README's results table and the per-suite strategy tables (and Pareto plots) in one run.

    python benchmarks/readme_tables.py                   # CPU: 10 prompts per suite, 1 thread, as in the README
    python benchmarks/readme_tables.py --n 200 --device cuda --dtype bf16 --batch-size 32   # GPU variant

Writes docs/results/strategies-{tiny,tiny-d2f}-DATE.json and docs/results/pareto-{tiny,tiny-d2f}-DATE.png
(DATE: today, UTC) and prints the markdown tables of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

import torch

TABLES = {
    # model: strategies; d2f decodes at the bundled skip_threshold (0.97), the last row is the library default 0.9
    "tiny": "vanilla,threshold,threshold:cache=prefix,threshold:cache=dual,factor:cache=dual,entropy,d3llm",
    "tiny-d2f": "vanilla,threshold,threshold:cache=dual,d2f,d2f:skip_threshold=0.9",
}


def markdown(report: dict) -> str:
    lines = ["| strategy | accuracy % | TPF | NFE | tokens/s | speedup | AUP |", "|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        lines.append(f"| `{r['label']}` | {r['accuracy']:.1f} | {r['tpf']:.2f} | {r['nfe']:.1f} | "
                     f"{r['tokens_per_second']:.0f} | {r['speedup']:.2f}x | {r['aup']:.1f} |")
    suites = sorted({s for r in report["results"] for s in r["per_suite"]})
    lines += ["", "| strategy | " + " | ".join(f"{s} acc / TPF" for s in suites) + " |",
              "|---|" + "---|" * len(suites)]
    for r in report["results"]:
        cells = [f"{r['per_suite'][s]['accuracy']:.0f} / {r['per_suite'][s]['tpf']:.2f}" for s in suites]
        lines.append(f"| `{r['label']}` | " + " | ".join(cells) + " |")
    m = report["machine"]
    lines.append(f"\n{report['n']} held-out prompts per suite, batch {report['batch_size']}, {m['device']}, "
                 f"torch threads {m['torch_threads']}, {m['date']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10, help="held-out prompts per suite")
    ap.add_argument("--suite", default="all")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--only", choices=sorted(TABLES), default=None)
    ap.add_argument("--out", default="docs/results")
    args = ap.parse_args(argv)

    from transformers.utils import logging as hf_logging

    from dllm.eval.bench import apply_sweep, pareto_plot, parse_methods, run_bench
    from dllm.loading import load_model, resolve_model_path
    from dllm.text import load_tokenizer_for

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    for model_name, strategies in TABLES.items():
        if args.only and model_name != args.only:
            continue
        path = resolve_model_path(model_name)
        model = load_model(path, device=args.device, dtype=args.dtype)
        report = run_bench(model, load_tokenizer_for(path), suites=args.suite,
                           methods=apply_sweep(parse_methods(strategies), None), n=args.n,
                           batch_size=args.batch_size)
        report["model"] = model_name
        report["command"] = "python benchmarks/readme_tables.py " + " ".join(argv or [])
        (out / f"strategies-{model_name}-{date}.json").write_text(json.dumps(report, indent=2) + "\n")
        pareto_plot(report, str(out / f"pareto-{model_name}-{date}.png"))
        print(f"\n### {model_name}\n")
        print(markdown(report))


if __name__ == "__main__":
    main()
