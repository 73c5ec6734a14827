"""Experiment: LoPA with the reference's full-window attention in the verification forward.

The LoPA reference (`use_full_attention=True`, its default) drops the block-causal mask inside the
fed window: the to-be-cached and active blocks attend to one another and to the cache prefix. A
lookahead token in a later block can then raise the confidence of earlier blocks, which the
block-causal `lopa` strategy cannot do (docs/lopa.md). This script measures whether that helps on
a model, without making it a strategy option:

* every forward of the decoding loop gets ``attention_policy="bidirectional"`` (the model's own
  mask is replaced for the fed window; the cached prefix stays visible);
* the K/V of blocks cached in a round now depend on the branch, so after each round the winner's
  cache rows are copied into the other branches of its row (the reference's winner-KV commit),
  and the loop's block-causal no-op check is switched off.

Both changes are monkeypatches local to this process. ``k = 0`` is D2F with full-window attention.

    python benchmarks/lopa_full_window.py --model tiny-d2f --suite gsm,arith --n 100 --branches 0,2,4

docs/lopa.md ("Full-window attention, measured") quotes this run.
"""

from __future__ import annotations

import argparse
import contextlib

import torch


@contextlib.contextmanager
def full_window(model):
    """Inside the block: full-window attention and the winner-KV commit (see the module docstring)."""
    import decoding.loops.lopa as lopa

    workers: list = []
    had_own_forward = "forward" in vars(model)
    orig_forward, orig_init = model.forward, lopa.SlotWorker.__init__
    orig_select, orig_check = lopa.select_winners, lopa._check_commit_noop

    def forward(*args, **kwargs):
        kwargs["attention_policy"] = "bidirectional"
        return orig_forward(*args, **kwargs)

    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        workers.append(self)

    def select(score, rows, groups, force_anchor=False):
        winners = orig_select(score, rows, groups, force_anchor)
        cache = workers[-1].cache if workers else None
        if cache is not None and groups > 1:
            for r in range(rows):
                src = int(winners[r]) * rows + r
                dst = torch.tensor([g * rows + r for g in range(groups) if g * rows + r != src])
                for buf in (*cache.keys, *cache.values):
                    buf[dst] = buf[src].clone()
        return winners

    model.forward = forward
    lopa.SlotWorker.__init__, lopa.select_winners = init, select
    lopa._check_commit_noop = lambda *a, **k: 0.0
    try:
        yield
    finally:
        if had_own_forward:
            model.forward = orig_forward
        else:
            del model.forward  # back to the class method
        lopa.SlotWorker.__init__, lopa.select_winners, lopa._check_commit_noop = orig_init, orig_select, orig_check


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-d2f")
    ap.add_argument("--suite", default="gsm,arith")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--branches", default="0,2,4", help="comma-separated lopa_branches values")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.loading import load_model, resolve_model_path
    from dllm.text import load_tokenizer_for
    from eval.bench import parse_methods, run_bench

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    if not model.is_block_causal:
        raise SystemExit(f"{args.model} is not block-causal: full-window attention is already its mask")
    tok = load_tokenizer_for(resolve_model_path(args.model))
    ks = [int(b) for b in args.branches.split(",")]
    methods = parse_methods(",".join(f"lopa:lopa_branches={k}" for k in ks))
    print(f"{args.model}: LoPA with the model's block-causal mask vs full-window attention, greedy, batch 1, "
          f"{args.n} test problems per suite, torch threads {args.threads} (accuracy and TPF as in dllm bench)")
    print(f"{'suite':6s} {'attention':12s} {'k':>3s} {'acc %':>6s} {'TPF':>5s}")
    result: dict = {}
    for mode in ("block_causal", "full_window"):
        with full_window(model) if mode == "full_window" else contextlib.nullcontext():
            report = run_bench(model, tok, suites=args.suite, methods=methods, n=args.n, progress=False)
        for k, row in zip(ks, report["results"], strict=True):
            for suite_name, ps in row["per_suite"].items():
                result[(suite_name, mode, k)] = {"accuracy": ps["accuracy"], "tpf": ps["tpf"]}
    for (suite_name, mode, k), row in sorted(result.items(), key=lambda kv: (args.suite.split(",").index(kv[0][0]),
                                                                            kv[0][1], kv[0][2])):
        print(f"{suite_name:6s} {mode:12s} {k:3d} {row['accuracy']:6.1f} {row['tpf']:5.2f}")
    return result


if __name__ == "__main__":
    main()
