"""How the approximate caches fail on list answers: accuracy per op and cache, and how many failures repeat a name.

The Fast-dLLM prefix and dual caches keep the prompt's K/V from the start of a block. Inside the
block the prompt positions then no longer see the answer being written, while the answer slots still
see each other (the current block is recomputed every step). On the bundled bidirectional `tiny`
copy and reverse survive this, but ops whose answer must not reuse a name collapse, and nearly every
wrong answer repeats a name: the model appears to tell which names are already written through the
prompt positions attending to the answer, which a cached prompt cannot carry.

For each list op (``--ops``) the first ``--n`` test problems of that op are decoded greedily with
``--strategy`` once per entry of ``--caches``. Reported per (op, cache): accuracy, failures, and
failures whose answer holds a name twice although the prompt's list holds every name once.

    python benchmarks/cache_list_failures.py --model tiny --ops shuffle,sort,copy --n 30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eval.outputs import check_output_args


def has_repeat(names: list[str]) -> bool:
    return len(set(names)) < len(names)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--ops", default="shuffle,sort,replace_random,copy,reverse", help="list ops, comma-separated")
    ap.add_argument("--caches", default="none,prefix,dual", help="cache modes, comma-separated")
    ap.add_argument("--strategy", default="threshold")
    ap.add_argument("--n", type=int, default=30, help="test problems per op")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.generation.config import CACHES
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite
    from training.rollouts import encode_prompt

    hf_logging.disable_progress_bar()
    ops, caches = args.ops.split(","), args.caches.split(",")
    try:
        suites = {op: get_suite("lists", ops=[op]) for op in ops}
    except ValueError as e:
        raise SystemExit(str(e)) from None
    bad = [c for c in caches if c not in CACHES]
    if bad:
        raise SystemExit(f"unknown cache(s) {', '.join(bad)}; valid: {', '.join(CACHES)}")
    if args.n < 1:
        raise SystemExit("--n must be at least 1")

    tok = load_tokenizer(resolve_model_path(args.model))
    model = load_model(args.model).eval()
    base = model.diffusion_generation_config.replace(
        strategy=args.strategy, temperature=0.0, mask_token_id=tok.mask_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    print(f"model={args.model} strategy={args.strategy} block_length={base.block_length} n={args.n}/op "
          f"torch_threads={torch.get_num_threads()}\n")
    print(f"{'op':<16}{'cache':<8}{'correct':>9}{'failures':>10}{'repeat a name':>15}")
    rows = []
    for op in ops:
        suite = suites[op]
        examples = list(suite.examples("test", args.n))
        for cache in caches:
            cfg = base.replace(cache=cache)
            correct = fails = repeats = 0
            for ex in examples:
                ids = torch.tensor([encode_prompt(tok, ex.prompt)])
                with torch.no_grad():
                    out = model.generate(ids, generation_config=cfg, tokenizer=tok)
                text = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
                if suite.score(ex, text).correct:
                    correct += 1
                    continue
                fails += 1
                prompt_names = ex.prompt.rsplit(":", 1)[-1].split()
                repeats += has_repeat(text.split()) and not has_repeat(prompt_names)
            rows.append({"op": op, "cache": cache, "n": len(examples), "correct": correct, "failures": fails,
                         "failures_repeating_a_name": repeats})
            print(f"{op:<16}{cache:<8}{correct:>5}/{len(examples):<3}{fails:>10}{repeats:>15}", flush=True)
    result = {"model": args.model, "strategy": args.strategy, "block_length": base.block_length,
              "torch_threads": torch.get_num_threads(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return result


if __name__ == "__main__":
    main()
