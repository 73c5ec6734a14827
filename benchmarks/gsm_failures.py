"""Why gsm answers fail: an arithmetic slip in a written step, or a right chain that ends wrong.

The gsm suite's reference answers are chains of equations (``12 * 9 = 108 . 108 - 18 = 90 . #### 90``).
Each wrong completion is put in one class, checked in this order:

* ``arithmetic slip``: some written equation ``a op b = c`` has the wrong ``c``;
* ``final copied wrong``: every equation is right but the number after ``####`` is not the last
  equation's result;
* ``wrong chain``: every equation is right and the final is the last result, but the chain used the
  wrong numbers or stopped early or went on too long;
* ``no equation``: nothing of the form ``a op b = c`` was written.

Slips are split by the step they first occur in. The first ``--n`` test problems are decoded greedily
with ``--strategy`` (default: the model's own).

    python benchmarks/gsm_failures.py --model tiny --n 200
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from eval.outputs import check_output_args

CLASSES = ("correct", "arithmetic slip", "final copied wrong", "wrong chain", "no equation")


def classify(completion: str, correct: bool) -> tuple[str, int | None]:
    """(class, 1-based step of the first slip or None) of one completion."""
    from eval.tasks.gsm import equation_is_right, extract_final_answer, written_equations

    if correct:
        return "correct", None
    eqs = written_equations(completion)
    if not eqs:
        return "no equation", None
    for i, eq in enumerate(eqs, 1):
        if not equation_is_right(eq):
            return "arithmetic slip", i
    if extract_final_answer(completion) != eqs[-1][3]:
        return "final copied wrong", None
    return "wrong chain", None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--strategy", default=None, help="decoding strategy (default: the model's own)")
    ap.add_argument("--n", type=int, default=200, help="gsm test problems")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--examples", type=int, default=0, help="print this many failures")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)
    if args.n < 1 or args.batch_size < 1:
        raise SystemExit("--n and --batch-size must be at least 1")
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from decoding import STRATEGIES
    from dllm.loading import load_model, resolve_model_path
    from dllm.text import generate_text
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite

    if args.strategy is not None and args.strategy not in STRATEGIES:
        raise SystemExit(f"unknown strategy {args.strategy!r}; valid: {', '.join(sorted(STRATEGIES))}")
    hf_logging.disable_progress_bar()
    tok = load_tokenizer(resolve_model_path(args.model))
    model = load_model(args.model).eval()
    cfg = model.diffusion_generation_config.replace(
        temperature=0.0, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    if args.strategy is not None:
        cfg = cfg.replace(strategy=args.strategy)
    suite = get_suite("gsm")
    examples = list(suite.examples("test", args.n))
    counts: Counter[str] = Counter()
    slip_step: Counter[int] = Counter()
    shown = 0
    for start in range(0, len(examples), args.batch_size):
        batch = examples[start:start + args.batch_size]
        with torch.no_grad():
            results = generate_text(model, tok, [ex.prompt for ex in batch], generation_config=cfg)
        for ex, res in zip(batch, results):
            text = res.text
            cls, step = classify(text, suite.score(ex, text).correct)
            counts[cls] += 1
            if step is not None:
                slip_step[step] += 1
            if cls != "correct" and shown < args.examples:
                print(f"[{cls}] got:  {text}\n{' ' * (len(cls) + 3)}want: {ex.answer}")
                shown += 1
    wrong = len(examples) - counts["correct"]
    print(f"model={args.model} strategy={cfg.strategy} n={len(examples)} torch_threads={torch.get_num_threads()}")
    for cls in CLASSES:
        share = f" ({100 * counts[cls] / wrong:.0f}% of failures)" if cls != "correct" and wrong else ""
        print(f"  {cls:<20}{counts[cls]:>5}{share}")
    if slip_step:
        print("  first slip at step: " + ", ".join(f"{k}: {v}" for k, v in sorted(slip_step.items())))
    result = {"model": args.model, "strategy": cfg.strategy, "n": len(examples),
              "torch_threads": torch.get_num_threads(), "counts": {c: counts[c] for c in CLASSES},
              "first_slip_step": {str(k): v for k, v in sorted(slip_step.items())}}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
