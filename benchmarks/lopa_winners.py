"""Which LoPA branch wins each round: the anchor (id 0) or the lookahead at the j-th most confident
masked position (id j). Greedy, the first N test problems per suite, with each run's accuracy and TPF.

    python benchmarks/lopa_winners.py --model tiny-d2f --suite gsm,arith --n 40 --branches 2,8
    python benchmarks/lopa_winners.py --model tiny-long-d2f --suite sudoku9,chain --n 100 --branches 2,8 \
        --set skip_threshold=0.7 --batch-size 50 --json winners.json

docs/lopa.md quotes both: on short answers they explain why TPF stops rising beyond k = 2, on long
ones why LoPA gains nothing on ``sudoku9``.
"""

from __future__ import annotations

import argparse
import collections
import json

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-d2f")
    ap.add_argument("--suite", default="gsm,arith")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--branches", default="2,8", help="comma-separated lopa_branches values")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="other generation-config overrides for every run (e.g. skip_threshold=0.7)")
    ap.add_argument("--batch-size", type=int, default=1, help="problems decoded together (LoPA is batch-"
                    "invariant: the counts do not depend on it)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the counts, accuracy and TPF of every run here")
    args = ap.parse_args(argv)
    if args.batch_size < 1 or args.n < 1 or args.threads < 1:
        ap.error("--batch-size, --n and --threads take positive whole numbers")
    try:
        branches = [int(b) for b in args.branches.split(",")]
    except ValueError:
        ap.error(f"--branches takes comma-separated whole numbers, not {args.branches!r}")
    if min(branches) < 0:
        ap.error("--branches: lookahead counts are 0 (plain d2f) or more")
    from dllm.eval.outputs import check_output_args

    check_output_args(ap, args.json)  # before the run: a report that cannot be written is lost
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.decoding.config import parse_overrides
    from dllm.eval.tasks import get_suite
    from dllm.loading import load_model, resolve_model_path
    from dllm.text import generate_text
    from dllm.tokenization import load_tokenizer

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    over = parse_overrides(args.set)
    base = model.diffusion_generation_config.replace(temperature=0.0, **over)
    result: dict = {}
    report: dict = {"model": args.model, "n": args.n, "overrides": over, "block_length": base.block_size,
                    "skip_threshold": base.skip_threshold, "rows": []}
    print(f"{args.model}: share of rounds won per branch id (0 = anchor), {args.n} test problems per suite, "
          f"block {base.block_size}, skip_threshold {base.skip_threshold:g}, greedy, torch threads {args.threads}")
    for suite_name in args.suite.split(","):
        suite = get_suite(suite_name)
        examples = suite.examples("test", args.n)
        for k in branches:
            cfg = base.replace(strategy="lopa", lopa_branches=k)
            wins: collections.Counter = collections.Counter()
            outs = []
            for i in range(0, len(examples), args.batch_size):
                chunk = examples[i: i + args.batch_size]
                with torch.no_grad():
                    outs += generate_text(model, tok, [e.prompt for e in chunk], generation_config=cfg)
            for o in outs:
                wins.update(o.stats["lopa_winners"])
            rounds = sum(wins.values())
            correct = sum(suite.score(e, o.text).correct for e, o in zip(examples, outs))
            tokens = sum(o.generated_tokens for o in outs)
            forwards = sum(o.num_forwards for o in outs)
            result[(suite_name, k)] = wins
            shares = ", ".join(f"{i}: {100 * c / rounds:.0f}%" for i, c in sorted(wins.items()))
            print(f"  {suite_name:9s} k={k:<3d} acc {100 * correct / len(outs):5.1f}%  TPF {tokens / forwards:5.2f}  "
                  f"rounds {rounds:5d}  {shares}")
            report["rows"].append({"suite": suite_name, "lopa_branches": k, "accuracy": correct / len(outs),
                                   "tokens": tokens, "rounds": forwards, "tpf": tokens / forwards,
                                   "wins": {str(i): c for i, c in sorted(wins.items())},
                                   "lookahead_share": 1 - wins.get(0, 0) / rounds if rounds else 0.0})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return result

if __name__ == "__main__":
    main()
