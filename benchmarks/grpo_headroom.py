"""Why GRPO's speed reward can or cannot move a suite: per-suite filter statistics of T=1 rollout
groups, and the greedy TPF against its per-block ceiling (docs/rl.md, "Session 5").

    python benchmarks/grpo_headroom.py --model tiny-d2f --threshold 0.9     # the groups table
    python benchmarks/grpo_headroom.py --model tiny-d2f --threshold 0.5

Groups: ``--prompts`` train problems per suite, ``--group-size`` samples each (temperature 1), counted
by the TPF-aware filter's two tests. Ceiling: threshold decoding needs at least one forward per
block, so a greedy answer of L tokens has TPF <= L / ceil(L / block); averaged over ``--n`` test
problems decoded greedily at threshold 0.9.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-d2f")
    ap.add_argument("--suites", default="arith,lists,countdown,sudoku")
    ap.add_argument("--threshold", type=float, default=0.9, help="rollout threshold of the groups")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--n", type=int, default=100, help="test problems per suite for the ceiling")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--block-length", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite
    from training.rollouts import generate_rollouts

    torch.set_num_threads(args.threads)
    tok = load_tokenizer(resolve_model_path(args.model))
    model = load_model(args.model)
    base = model.diffusion_generation_config.replace(
        strategy="threshold", max_new_tokens=args.max_new_tokens, block_length=args.block_length,
        stop_at_eos=True, mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id)
    sample, greedy = base.replace(temperature=1.0, threshold=args.threshold), base.replace(temperature=0.0, threshold=0.9)
    print(f"{args.model}: {args.group_size} samples of {args.prompts} train prompts at threshold {args.threshold}; "
          f"greedy ceiling on {args.n} test problems at 0.9, torch threads {args.threads}\n")
    print("| suite | groups with a correct rollout | TPF range >= 0.01 | kept | all correct, flat TPF "
          "| greedy TPF | ceiling |")
    print("|---|---|---|---|---|---|---|")
    tpfs, caps = [], []
    for name in args.suites.split(","):
        suite = get_suite(name)
        ro = generate_rollouts(model, tok, suite.examples("train", args.prompts, seed=1), args.group_size, sample,
                               seed=0, truncated_is_wrong=True)
        c, t = ro.grouped(ro.correct).bool(), ro.grouped(ro.tpf).double()
        spread = (t.max(-1).values - t.min(-1).values) >= 0.01 - 1e-6
        anyc = c.any(-1)
        ev = generate_rollouts(model, tok, suite.examples("test", args.n, seed=0), 1, greedy, seed=0,
                               truncated_is_wrong=False)
        L = ev.lengths.double()
        cap = float((L / torch.ceil(L / args.block_length)).mean())
        tpfs.append(float(ev.tpf.mean()))
        caps.append(cap)
        print(f"| {name} | {int(anyc.sum())} / {len(c)} | {int(spread.sum())} | {int((anyc & spread).sum())} | "
              f"{int((c.all(-1) & ~spread).sum())} | {tpfs[-1]:.2f} | {cap:.2f} |")
    print(f"\nmean greedy TPF {sum(tpfs) / len(tpfs):.2f}, mean ceiling {sum(caps) / len(caps):.2f}")


if __name__ == "__main__":
    main()
