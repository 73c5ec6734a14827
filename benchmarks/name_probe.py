"""Does a model pair each name of a list with its partner? Masked-name accuracy on ``longlists``.

Every ``longlists`` item is a full name, ``First Last``. For every test problem, one forward over a
canvas holding the reference answer with

* ``--masked last`` (default): every last name masked, the first names shown: the model must find
  each first name's item in the prompt and read the name after it (with repeated first names, also
  order them by last name);
* ``--masked first``: every first name masked, the last names shown;

and a masked name counts as right when its argmax is the reference token. Prints the accuracy per
list operation. Sorting and deduplicating move items away from their place in the prompt, so a
model that orders the first names right but cannot pair them writes lists of real names that
are not the prompt's.

    python benchmarks/name_probe.py --model tiny-long --n 60
    python benchmarks/name_probe.py --model tiny-long --suite "longlists:max_items=12" --gen-length 64

docs/training.md ("Long-answer models") quotes it: why `sort` stays at 0.
"""

from __future__ import annotations

import argparse
import json

import torch


def name_slots(answer_len: int, masked: str) -> list[int]:
    """Canvas positions of the first (``first``) or last (``last``) names of an answer of ``answer_len``
    tokens laid out as ``First Last , First Last , ...`` (EOS excluded)."""
    offset = 1 if masked == "last" else 0
    return [i for i in range(offset, answer_len, 3)]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-long")
    ap.add_argument("--suite", default="longlists", help="longlists, with options as dllm bench takes them "
                    "(longlists:max_items=12)")
    ap.add_argument("--n", type=int, default=60, help="test problems per operation")
    ap.add_argument("--masked", choices=("last", "first"), default="last")
    ap.add_argument("--gen-length", type=int, default=None, help="answer canvas (default: the model's max_new_tokens)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from dllm.eval.outputs import check_output_args

    check_output_args(ap, args.json)
    if args.n < 1:
        ap.error("--n must be >= 1")
    from dllm.eval.tasks import LongListsSuite, get_suite, resolve_suites

    try:
        suites = resolve_suites(args.suite)
    except ValueError as err:
        ap.error(str(err))
    if len(suites) != 1 or not isinstance(suites[0], LongListsSuite):
        ap.error(f"--suite must be longlists (with options or not); got {args.suite!r}")
    base = suites[0]
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from dllm.training.rollouts import encode_prompt

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    gen_length = args.gen_length or model.diffusion_generation_config.max_new_tokens
    by_op = {}
    for op in base.ops:
        suite = get_suite("longlists", ops=[op], min_items=base.items[0], max_items=base.items[1])
        right = total = 0
        for ex in suite.examples("test", args.n):
            prompt = encode_prompt(tok, ex.prompt)
            answer = tok(ex.answer, add_special_tokens=False)["input_ids"]
            if len(answer) + 1 > gen_length:
                ap.error(f"a reference answer of {len(answer) + 1} tokens does not fit --gen-length {gen_length}")
            canvas = torch.tensor(answer + [tok.eos_token_id] * (gen_length - len(answer)))
            slots = name_slots(len(answer), args.masked)
            canvas[slots] = tok.mask_token_id
            with torch.no_grad():
                pred = model(torch.cat([torch.tensor(prompt), canvas])[None]).logits[0, len(prompt):].argmax(-1)
            right += sum(int(pred[i]) == answer[i] for i in slots)
            total += len(slots)
        by_op[op] = {"right": right, "names": total, "accuracy": right / total}
    report = {"model": args.model, "suite": args.suite, "n": args.n, "masked": args.masked,
              "gen_length": gen_length, "by_op": by_op}
    print(f"{args.model} on {args.suite}, {args.n} test problems per operation, {args.masked} names masked, "
          f"canvas {gen_length}, torch threads {args.threads}")
    for op, r in by_op.items():
        print(f"  {op:8s} {100 * r['accuracy']:5.1f}% of {r['names']} names")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
