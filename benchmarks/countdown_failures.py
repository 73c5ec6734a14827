"""Why countdown answers fail: by the shape of the reference expression and by the kind of error.

Each greedy completion of the first ``--n`` countdown test problems is scored with the suite's own
scorer and counted under the shape of the canonical reference (numbers replaced by ``n``, e.g.
``n * ( n - n )``). A wrong answer is ``wrong value`` (a readable expression over exactly the given
numbers that misses the target), ``wrong numbers`` (readable, but not the given multiset, or an
inexact division), ``wrong step`` (an answer written as steps, ``3 * 5 = 15 , 15 + 7 = 22``, or as
a chain, ``3 * 5 = 15 + 7 = 22``, with a step whose stated result is false) or ``unreadable``. Right
answers are split into the canonical reference (as an expression, its steps or its chain) and other
valid answers, which shows whether a model searches or recalls the canonical form. For answers
written as steps or chains it also counts how many first steps are arithmetically true and how
many last steps reach the target (``steps`` in the JSON); ``--block-length 1`` decodes strictly
left to right.

``--pairs`` scores the two-number problems instead (``numbers 4 7 target 28 :`` -> ``4 * 7``, the
``pairs`` training option's problems, all 654 of them, 598 in the training split and 56 in the
test split; ``--split`` picks which, ``--n`` caps the count): their shapes are the single
operations (``n * n``), so it shows whether a model can tell which one operation lands on a
target at all.

``--ablate-tags`` (models whose tokenizer has number tags, ``number_tags``): every tag in the prompt
is replaced by the empty digit it stands where (``▁⟦15⟧ ∅ 1 5`` -> ``▁∅ ∅ 1 5``) before generating,
so the prompt keeps only the digit view. The drop against a plain run is how much the model reads
the whole-number view at all.

    python benchmarks/countdown_failures.py --model tiny --strategy vanilla --n 600
    python benchmarks/countdown_failures.py --model tiny --strategy vanilla --pairs --split train
    python benchmarks/countdown_failures.py --model <tagged model> --strategy vanilla --n 600 --ablate-tags
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

import torch

from eval.outputs import check_output_args

KINDS = ("correct", "wrong value", "wrong numbers", "wrong step", "unreadable")


def shape(expression: str) -> str:
    return re.sub(r"\d+", "n", expression)


def classify(score) -> str:
    """One of KINDS for a countdown ``Score``."""
    if score.correct:
        return "correct"
    if score.reward == 0.0:
        return "unreadable"
    d = score.details
    if d.get("false_claim"):
        return "wrong step"
    return "wrong value" if d.get("uses_numbers") and "error" not in d else "wrong numbers"


def is_canonical(score, text: str, reference: str) -> bool:
    """Whether a right answer is the reference written as an expression, as steps or as a chain."""
    from eval.tasks.countdown import render_chain, render_steps

    if score.details["expression"] == reference:
        return True
    line = text.strip().splitlines()[0].strip()
    return bool(score.details.get("steps")) and line in (render_steps(reference), render_chain(reference))


def step_checks(text: str, target: int) -> tuple[bool, bool] | None:
    """For an answer written as steps or as a chain: (its first step's arithmetic is true, its last
    step's operation on the operands it wrote reaches the target); None for a plain expression.
    Tells a model that computes its intermediate values from one that fills them in to make the
    last step come out."""
    from eval.tasks.countdown import _STEP_RE, chain_to_steps
    from eval.tasks.expression import ExpressionValueError, evaluate

    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    line = chain_to_steps(lines[0]) or lines[0]
    steps = [_STEP_RE.match(part) for part in line.split(",")]
    if not steps or not all(steps):
        return None

    def value(m) -> int | None:
        try:
            return evaluate((m.group(2), int(m.group(1)), int(m.group(3))))
        except ExpressionValueError:
            return None

    return value(steps[0]) == int(steps[0].group(4)), value(steps[-1]) == target


def pair_examples(split: str, n: int) -> list:
    """The first ``n`` two-number problems of ``split``, in enumeration order, as suite examples."""
    from eval.tasks import Example
    from eval.tasks.base import split_of_key
    from eval.tasks.countdown import all_pair_problems

    problems = [p for p in all_pair_problems() if split_of_key(p.key) == split][:n]
    return [Example(f"countdown-pairs-{split}-{i:05d}", "countdown", p.prompt, p.answer, {**p.meta, "key": p.key})
            for i, p in enumerate(problems)]


def tag_ablation_map(tokenizer) -> torch.Tensor | None:
    """An id -> id table that sends every number tag to the empty digit it stands where
    (``dllm.tokenization.tag_origin``) and every other id to itself; None if the vocabulary has no tags."""
    from dllm.tokenization import tag_origin

    vocab = tokenizer.get_vocab()
    table = torch.arange(max(vocab.values()) + 1)
    tagged = False
    for piece, i in vocab.items():
        if (origin := tag_origin(piece)) is not None:
            table[i] = vocab[origin]
            tagged = True
    return table if tagged else None


def generate_ablated(model, tokenizer, prompts: list[str], cfg, table: torch.Tensor) -> list[str]:
    """Greedy completions of ``prompts`` with their ids mapped through ``table`` first."""
    from dllm.text import completion_text, encode_prompts

    ids, mask = encode_prompts(tokenizer, prompts)
    ids = table[ids]
    out = model.generate(ids, attention_mask=mask, generation_config=cfg.replace(return_dict_in_generate=True))
    p = ids.shape[1]
    return [completion_text(tokenizer, out.sequences[i, p:].tolist(), cfg.eos_token_id, cfg.stop_strings)
            for i in range(len(prompts))]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--strategy", default=None, help="decoding strategy (default: the model's own)")
    ap.add_argument("--n", type=int, default=600, help="countdown problems")
    ap.add_argument("--split", choices=("test", "train"), default="test",
                    help="held-out problems (default) or training-split ones, to tell memorising from learning")
    ap.add_argument("--block-length", type=int, default=None,
                    help="decoding block length (1: strictly left to right); default: the model's own")
    ap.add_argument("--pairs", action="store_true",
                    help="score the two-number problems of --split (up to --n) instead of three-number ones")
    ap.add_argument("--ablate-tags", action="store_true",
                    help="replace the prompt's number tags by the empty digits they stand where (tagged tokenizers)")
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
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
    table = tag_ablation_map(tok) if args.ablate_tags else None
    if args.ablate_tags and table is None:
        raise SystemExit(f"--ablate-tags: the tokenizer of {args.model!r} has no number tags (number_tags)")
    model = load_model(args.model).eval()
    cfg = model.diffusion_generation_config.replace(
        temperature=0.0, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    if args.strategy is not None:
        cfg = cfg.replace(strategy=args.strategy)
    if args.block_length is not None:
        try:
            cfg = cfg.replace(block_length=args.block_length)
        except ValueError as err:
            raise SystemExit(f"--block-length: {err}") from None
    suite = get_suite("countdown")
    if args.pairs:
        examples = pair_examples(args.split, args.n)
    else:
        examples = list(suite.examples(args.split, args.n))
    kinds: Counter[str] = Counter()
    right_form: Counter[str] = Counter()
    by_shape: dict[str, list[int]] = {}
    steps: Counter[str] = Counter()
    for start in range(0, len(examples), args.batch_size):
        batch = examples[start:start + args.batch_size]
        with torch.no_grad():
            prompts = [ex.prompt for ex in batch]
            if table is None:
                texts = [res.text for res in generate_text(model, tok, prompts, generation_config=cfg)]
            else:
                texts = generate_ablated(model, tok, prompts, cfg, table)
        for ex, text in zip(batch, texts):
            score = suite.score(ex, text)
            kind = classify(score)
            kinds[kind] += 1
            if score.correct:
                right_form["canonical" if is_canonical(score, text, ex.answer) else "other"] += 1
            if (checks := step_checks(text, ex.meta["target"])) is not None:
                steps["answers"] += 1
                steps["first step true"] += checks[0]
                steps["last step reaches target"] += checks[1]
            cell = by_shape.setdefault(shape(ex.answer), [0, 0])
            cell[0] += score.correct
            cell[1] += 1
    shapes = {s: {"correct": c, "n": m} for s, (c, m) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])}
    print(f"model={args.model} strategy={cfg.strategy} block_length={cfg.block_length} split={args.split} "
          f"{'pairs ' if args.pairs else ''}{'tags ablated ' if args.ablate_tags else ''}"
          f"n={len(examples)} torch_threads={torch.get_num_threads()}")
    for k in KINDS:
        print(f"  {k:<15}{kinds[k]:>5}")
    print(f"  right answers: {right_form['canonical']} canonical, {right_form['other']} other valid")
    if steps["answers"]:
        print(f"  answers as steps/chains: {steps['answers']}; first step true {steps['first step true']}, "
              f"last step reaches the target {steps['last step reaches target']}")
    for s, v in shapes.items():
        print(f"  {s:<22}{v['correct']:>4}/{v['n']:<4}{100 * v['correct'] / v['n']:6.1f}%")
    result = {"model": args.model, "strategy": cfg.strategy, "block_length": cfg.block_length,
              "split": args.split, "pairs": args.pairs, "ablate_tags": args.ablate_tags, "n": len(examples),
              "torch_threads": torch.get_num_threads(), "counts": {k: kinds[k] for k in KINDS},
              "right_answers": {"canonical": right_form["canonical"], "other": right_form["other"]},
              "steps": {k: steps[k] for k in ("answers", "first step true", "last step reaches target")},
              "by_shape": shapes}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
