"""Write a countdown answer table: for every training problem, the solving expression a model finds
most likely, for ``data.suite_options.countdown={answers: table, answer_table: PATH}``.

A countdown problem often has several right answers (3.6 distinct expressions on average over the
16,292 problems with targets 1-100). Teaching the enumeration's *first* one asks the model to know
that every earlier expression misses; teaching a random one (``answers=any``) gives the same prompt
several targets and greedy decoding mixes their tokens. A table keeps one target per problem but
lets the model's own preference pick it: each solving expression is scored by the log-probability
the model gives its tokens (EOS padding included) in one forward over a fully masked answer canvas,
which is where greedy decoding starts, and the best-scoring one is kept. Problems with one solution,
and those where the canonical answer scores best or within ``--margin`` nats of the best, keep the
canonical answer and are left out of the table.

    python -m dllm.training.countdown_answers --model runs/sft/final --out runs/cd-table.json
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch


def training_problems() -> list[tuple[tuple[int, ...], int]]:
    """Every training-split (sorted numbers, target) pair of the countdown suite."""
    from dllm.eval.tasks.base import split_of_key
    from dllm.eval.tasks.countdown import MAX_NUMBER, MAX_TARGET, MIN_NUMBER, MIN_TARGET, N_NUMBERS, all_solutions

    out = []
    for numbers in itertools.combinations_with_replacement(range(MIN_NUMBER, MAX_NUMBER + 1), N_NUMBERS):
        for target in sorted(all_solutions(numbers)):
            key = " ".join(map(str, numbers)) + f"={target}"
            if MIN_TARGET <= target <= MAX_TARGET and split_of_key(key) == "train":
                out.append((numbers, target))
    return out


@torch.no_grad()
def score_answers(model, tokenizer, prompt: str, answers: list[str], gen_length: int, scored: int) -> list[float]:
    """Log-probability of each answer's first ``scored`` canvas tokens (answer, then EOS) given the
    prompt and a canvas of ``gen_length`` masks: all answers share one forward."""
    from dllm.training.encoding import encode_answer, encode_prompt

    q = encode_prompt(tokenizer, prompt)
    mask_id, eos_id = tokenizer.mask_token_id, tokenizer.eos_token_id
    canvas = torch.tensor([q + [mask_id] * gen_length])
    logits = model(canvas, prompt_length=len(q), logits_range=(len(q), len(q) + scored)).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    targets = []
    for a in answers:
        ids = encode_answer(tokenizer, a)
        if len(ids) > scored:
            raise ValueError(f"answer {a!r} is {len(ids)} tokens, more than the {scored} scored")
        targets.append(ids + [eos_id] * (scored - len(ids)))
    t = torch.tensor(targets)
    return logp.gather(1, t.T).sum(dim=0).tolist()


def build_table(model, tokenizer, margin: float = 0.0, gen_length: int = 64, scored: int = 32,
                problems: list[tuple[tuple[int, ...], int]] | None = None, progress: bool = True) -> dict:
    """The table (as written to JSON) and counts of what it changed, over ``problems`` (default:
    every training problem)."""
    from dllm.eval.tasks.countdown import TABLE_FORMAT, all_solutions

    problems = training_problems() if problems is None else problems
    from tqdm.auto import tqdm

    answers: dict[str, str] = {}
    multi = 0
    for numbers, target in tqdm(problems, desc="countdown answers", unit="problem", disable=not progress):
        candidates = list(all_solutions(numbers)[target])
        if len(candidates) == 1:
            continue
        multi += 1
        prompt = f"numbers {' '.join(map(str, numbers))} target {target} :"
        scores = score_answers(model, tokenizer, prompt, candidates, gen_length, scored)
        best = max(range(len(candidates)), key=lambda j: (scores[j], -j))  # ties: enumeration order
        if best != 0 and scores[best] > scores[0] + margin:
            answers[" ".join(map(str, numbers)) + f"={target}"] = candidates[best]
    return {"format": TABLE_FORMAT, "version": 1, "margin": margin, "training_problems": len(problems),
            "with_several_solutions": multi, "changed": len(answers), "answers": answers}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="tiny, a checkpoint or an export directory")
    ap.add_argument("--out", type=Path, required=True, help="JSON table to write")
    ap.add_argument("--margin", type=float, default=0.0,
                    help="nats by which another solution must beat the canonical one to replace it")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="only the first N training problems (a quick look)")
    args = ap.parse_args(argv)
    if args.margin < 0:
        raise SystemExit("--margin must be >= 0")
    if args.limit is not None and args.limit < 1:
        raise SystemExit("--limit must be at least 1")
    torch.set_num_threads(args.threads)

    from dllm.loading import CheckpointError, load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer

    try:
        tokenizer = load_tokenizer(resolve_model_path(args.model))
        model = load_model(args.model).eval()
    except (CheckpointError, OSError) as e:
        raise SystemExit(f"cannot load {args.model!r}: {e}") from None
    problems = training_problems()[: args.limit]
    table = build_table(model, tokenizer, args.margin, problems=problems, progress=args.limit is None)
    table["model"] = str(args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    tmp.replace(args.out)
    print(f"{table['changed']} of {table['with_several_solutions']} training problems with several "
          f"solutions get a non-canonical answer ({table['training_problems']} training problems); wrote {args.out}")
    return table


if __name__ == "__main__":
    main()
