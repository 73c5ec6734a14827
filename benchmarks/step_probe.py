"""Does a model compute each step of a worked solution? Per-step result accuracy with the reference shown.

For every test problem of a worked-solution suite (``chain``, ``gsm``) and every result in its reference
answer (the number after each ``=``, and the final one after ``####``), one forward over a canvas that
shows the reference answer

* ``--shown cut`` (default): up to that result, with it and everything after it masked: the state in
  which a left-to-right decoder meets the result, where only the arithmetic gives it;
* ``--shown rest``: everywhere but that result: later copies of it (the next step's first operand,
  the final answer) can be read, so this also measures copying;

and the result counts as right when the argmax of every one of its tokens is the reference token.
Prints the accuracy by step index and over all steps, and the share of problems with every step right.

    python benchmarks/step_probe.py --model tiny-long --suite chain --n 40
    python benchmarks/step_probe.py --model tiny-long --suite chain --n 40 --shown rest

docs/training.md ("Long-answer models") quotes it: why `chain` fails, and what the recipes do about it.
"""

from __future__ import annotations

import argparse
import json

import torch


def result_runs(slots: torch.Tensor) -> list[tuple[int, int]]:
    """``[(start, end), ...]``: the runs of True in a 1-d bool tensor, end exclusive, in order."""
    runs, start = [], None
    for i, on in enumerate(slots.tolist() + [False]):
        if on and start is None:
            start = i
        elif not on and start is not None:
            runs.append((start, i))
            start = None
    return runs


def probe_canvas(answer: torch.Tensor, run: tuple[int, int], gen_length: int, mask_id: int, shown: str) -> torch.Tensor:
    """The answer canvas (``gen_length`` slots) for one result ``run`` of the reference ``answer``."""
    canvas = torch.full((gen_length,), mask_id, dtype=answer.dtype)
    start, end = run
    if shown == "cut":
        canvas[:start] = answer[:start]
    else:
        canvas[: len(answer)] = answer
        canvas[start:end] = mask_id
    return canvas


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-long")
    ap.add_argument("--suite", default="chain", help="a worked-solution suite: chain or gsm")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--shown", choices=("cut", "rest"), default="cut",
                    help="cut: the answer up to the result; rest: all of it but the result")
    ap.add_argument("--gen-length", type=int, default=None, help="answer canvas (default: the model's "
                    "max_new_tokens; 0: each reference answer's own length, EOS included)")
    ap.add_argument("--show", type=int, default=0, metavar="N", help="print every result of the first N "
                    "problems: the equation, the model's result and (in brackets) the reference's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from dllm.eval.outputs import check_output_args

    check_output_args(ap, args.json)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.eval.tasks import get_suite
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from dllm.training.objectives import result_slots
    from dllm.training.rollouts import encode_prompt
    from dllm.training.sft import result_token_ids

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    gen_length = model.diffusion_generation_config.max_new_tokens if args.gen_length is None else args.gen_length
    triggers, numbers = result_token_ids(tok, ["=", "#"])
    right: dict[int, int] = {}
    total: dict[int, int] = {}
    whole = 0
    examples = get_suite(args.suite).examples("test", args.n)
    shown = []
    for i, ex in enumerate(examples):
        prompt = torch.tensor(encode_prompt(tok, ex.prompt))
        answer = torch.tensor(tok(ex.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        width = gen_length or len(answer)
        if len(answer) > width:
            ap.error(f"a reference answer of {len(answer)} tokens does not fit --gen-length {gen_length}")
        runs = result_runs(result_slots(answer[None], triggers, numbers)[0])
        canvases = torch.stack([probe_canvas(answer, r, width, tok.mask_token_id, args.shown) for r in runs])
        ids = torch.cat([prompt.expand(len(runs), -1), canvases], dim=1)
        with torch.no_grad():
            pred = model(ids).logits[:, len(prompt):].argmax(-1)
        ok_all = True
        for k, (s, e) in enumerate(runs):
            ok = bool((pred[k, s:e] == answer[s:e]).all())
            right[k] = right.get(k, 0) + ok
            total[k] = total.get(k, 0) + 1
            ok_all &= ok
        whole += ok_all
        if i < args.show:
            text = lambda t: tok.decode(t, skip_special_tokens=False).replace("\u2205", "").strip(" .")  # noqa: E731
            ends = [0] + [e for _, e in runs]
            shown.append(" | ".join(f"{text(answer[ends[k]:s])} {text(pred[k, s:e])} ({text(answer[s:e])})"
                                    for k, (s, e) in enumerate(runs)))
    steps = sum(total.values())
    report = {"model": args.model, "suite": args.suite, "n": len(examples), "shown": args.shown,
              "gen_length": gen_length, "step_accuracy": sum(right.values()) / steps, "steps": steps,
              "all_steps_right": whole / len(examples),
              "by_step": [{"step": k + 1, "right": right[k], "n": total[k]} for k in sorted(total)]}
    print(f"{args.model} on {args.suite}, {len(examples)} test problems, reference shown: {args.shown}, "
          f"canvas {gen_length or 'the answer'}, torch threads {args.threads}")
    print(f"  results right: {100 * report['step_accuracy']:.1f}% of {steps}; problems with every result right: "
          f"{100 * report['all_steps_right']:.1f}%")
    print("  by result index: " + "  ".join(f"{r['step']}: {r['right']}/{r['n']}" for r in report["by_step"]))
    for line in shown:
        print("  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
