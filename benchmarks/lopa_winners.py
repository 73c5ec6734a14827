"""Which LoPA branch wins each round: the anchor (id 0) or the lookahead at the j-th most confident
masked position (id j). Greedy, batch 1, the first N test problems per suite.

    python benchmarks/lopa_winners.py --model tiny-d2f --suite gsm,arith --n 40 --branches 2,8

The README's LoPA section quotes this run: it explains why TPF stops rising beyond k = 2.
"""

from __future__ import annotations

import argparse
import collections

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-d2f")
    ap.add_argument("--suite", default="gsm,arith")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--branches", default="2,8", help="comma-separated lopa_branches values")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.eval.tasks import get_suite
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from dllm.training.rollouts import encode_prompt

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    base = model.diffusion_generation_config
    result: dict = {}
    print(f"{args.model}: share of rounds won per branch id (0 = anchor), {args.n} test problems per suite, "
          f"batch 1, torch threads {args.threads}")
    for suite in args.suite.split(","):
        examples = get_suite(suite).examples("test", args.n)
        for k in (int(b) for b in args.branches.split(",")):
            cfg = base.replace(strategy="lopa", lopa_branches=k, temperature=0.0, mask_token_id=tok.mask_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                               return_dict_in_generate=True)
            wins: collections.Counter = collections.Counter()
            for ex in examples:
                ids = torch.tensor([encode_prompt(tok, ex.prompt)])
                with torch.no_grad():
                    out = model.generate(ids, generation_config=cfg, tokenizer=tok)
                wins.update(out.stats["lopa_winners"][0])
            rounds = sum(wins.values())
            result[(suite, k)] = wins
            shares = ", ".join(f"{i}: {100 * c / rounds:.0f}%" for i, c in sorted(wins.items()))
            print(f"  {suite:6s} k={k:<3d} rounds {rounds:4d}  {shares}")
    return result


if __name__ == "__main__":
    main()
