"""Which part of the ``arith`` format keeps a small model from learning it (docs/training.md).

Trains the tiny recipe's model from scratch on ``arith`` alone, once per variant, with identical
settings (batch 128, lr 1e-3 cosine over --steps, 16-token canvas), and prints the greedy held-out
accuracy the run's own evaluation reports (64 test problems) at the middle and the end:

* ``plain``: the suite as is (``What is 35 + 84 ?`` -> ``119``);
* ``pad-answer``: answers zero-padded to 4 digits (``0119``);
* ``no-mul``: only + and - problems;
* ``pad-operands``: operands zero-padded to 3 digits and answers to 4 (``What is 035 + 084 ?``);
* ``tok-pad3`` / ``tok-pad4``: the plain text, with a tokenizer that left-pads numbers to 3 / 4
  digits with an empty-digit token (``model.pad_numbers``);
* ``tok-num2`` / ``tok-num3``: the plain text, with a tokenizer that makes every number of up to
  2 / 3 digits one token (``model.number_tokens``);
* ``tok-tag4``: ``tok-pad4`` plus a whole-number tag token before each padded number
  (``model.number_tags``: both views of a number).

    python benchmarks/arith_format.py --variants plain,tok-pad4 --steps 600 --threads 2

Each run takes a few minutes on 2 CPU threads; results go to ``--out`` (one run directory each).
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("plain", "pad-answer", "no-mul", "pad-operands", "tok-pad3", "tok-pad4", "tok-num2", "tok-num3", "tok-tag4")


def _patch(variant: str) -> None:
    """Rewrite the arith problems for a text variant (the tokenizer variants keep the text)."""
    from eval.tasks import arith
    from eval.tasks.base import Problem

    draw = arith.ArithSuite._draw

    def patched(self, rng):
        p = draw(self, rng)
        while variant == "no-mul" and p.meta["op"] == "*":
            p = draw(self, rng)
        m = p.meta
        if variant == "pad-answer":
            return Problem(p.key, p.prompt, f"{m['answer']:04d}", m)
        if variant == "pad-operands":
            return Problem(p.key, f"What is {m['a']:03d} {m['op']} {m['b']:03d} ?", f"{m['answer']:04d}", m)
        return p

    arith.ArithSuite._draw = patched


def _train(variant: str, overrides: list[str]) -> None:
    """Child process: patch the suite, then run ``dllm train sft`` with ``overrides``."""
    _patch(variant)
    from training.cli import main

    sys.argv = ["train", "sft", *overrides]
    main()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/arith-format"))
    ap.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default=None,
                    help="override the recipe's (bf16); 'no' on CPUs without native bf16")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args._child:
        _train(args._child, rest)
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; valid: {', '.join(VARIANTS)}")
    rows = []
    for v in variants:
        run = args.out / v
        # the tiny recipe builds its tokenizer from the suites; only the number padding differs per variant
        overrides = ["--config", str(ROOT / "recipes" / "tiny-sft.yaml"), f"run_dir={run}", f"export_dir={run}/final",
                     f"max_steps={args.steps}", "batch_size=128", "grad_accum=1", f"num_threads={args.threads}",
                     "data.tasks={arith: 1.0}", "data.max_new_tokens=16", f"eval_every={args.steps // 2}",
                     "eval_examples=64", f"save_every={args.steps}", "progress=false"]
        overrides += [f"model.pad_numbers={v[-1] if v.startswith(('tok-pad', 'tok-tag')) else 0}",
                      f"model.number_tokens={v[-1] if v.startswith('tok-num') else 0}",
                      f"model.number_tags={v.startswith('tok-tag')}"]
        if args.mixed_precision:
            overrides += [f"mixed_precision={args.mixed_precision}"]
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
        subprocess.run([sys.executable, __file__, "--_child", v, *overrides], cwd=ROOT, env=env, check=True)
        with open(run / "eval.csv") as f:
            evals = {int(r["step"]): float(r["arith"]) for r in csv.DictReader(f)}
        rows.append((v, evals))
    print(f"{'variant':<14}" + "".join(f"{'step ' + str(s):>12}" for s in sorted(rows[0][1])))
    for v, evals in rows:
        print(f"{v:<14}" + "".join(f"{100 * evals[s]:>11.1f}%" for s in sorted(evals)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
