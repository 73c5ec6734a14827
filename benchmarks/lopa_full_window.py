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
import time

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
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite
    from training.rollouts import encode_prompt

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    if not model.is_block_causal:
        raise SystemExit(f"{args.model} is not block-causal: full-window attention is already its mask")
    tok = load_tokenizer(resolve_model_path(args.model))
    base = model.diffusion_generation_config
    print(f"{args.model}: LoPA with the model's block-causal mask vs full-window attention, greedy, batch 1, "
          f"{args.n} test problems per suite, torch threads {args.threads}")
    print(f"{'suite':6s} {'attention':12s} {'k':>3s} {'acc %':>6s} {'TPF':>5s} {'rounds':>6s} {'s':>5s}")
    result: dict = {}
    for suite_name in args.suite.split(","):
        suite = get_suite(suite_name)
        examples = suite.examples("test", args.n)
        for mode in ("block_causal", "full_window"):
            for k in (int(b) for b in args.branches.split(",")):
                cfg = base.replace(strategy="lopa", lopa_branches=k, temperature=0.0,
                                   mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id, return_dict_in_generate=True)
                correct = tokens = rounds = 0
                t0 = time.perf_counter()
                with full_window(model) if mode == "full_window" else contextlib.nullcontext():
                    for ex in examples:
                        ids = torch.tensor([encode_prompt(tok, ex.prompt)])
                        with torch.no_grad():
                            out = model.generate(ids, generation_config=cfg, tokenizer=tok)
                        text = tok.decode(out.sequences[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
                        correct += int(suite.score(ex, text).correct)
                        tokens += int(out.generated_tokens[0])
                        rounds += int(out.num_forwards[0])
                row = {"accuracy": 100.0 * correct / len(examples), "tpf": tokens / rounds, "rounds": rounds}
                result[(suite_name, mode, k)] = row
                print(f"{suite_name:6s} {mode:12s} {k:3d} {row['accuracy']:6.1f} {row['tpf']:5.2f} {rounds:6d} "
                      f"{time.perf_counter() - t0:5.0f}", flush=True)
    return result


if __name__ == "__main__":
    main()
