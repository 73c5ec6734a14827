"""Decoding-loop overhead: the share of generate's wall time spent inside model forwards.

    python benchmarks/overhead.py --model tiny --model-d2f tiny-d2f --new-tokens 256 [--repeats 3] [--json out.json]

Batch 1, one prompt per suite, every strategy; the forward time is measured by the model runner
around each model call (with CUDA synchronisation on GPU). Everything else -- policies, canvas
bookkeeping, stopping checks -- is loop overhead. Strategies run interleaved, ``--repeats`` times.

``host reads/fwd``: the reads of tensor values by Python per forward (``bool(t)``, ``.item()``,
``.tolist()``, ``.cpu()``, ...), each a synchronisation that a GPU waits for, counted on the first prompt
in an untimed run (``dllm.testing.HostReads``).
"""

from __future__ import annotations

import argparse
import json

import torch

from dllm.eval.outputs import check_output_args

STRATEGIES = [
    ("vanilla", "tiny", {"strategy": "vanilla"}),
    ("threshold", "tiny", {"strategy": "threshold"}),
    ("threshold+prefix", "tiny", {"strategy": "threshold", "cache": "prefix"}),
    ("threshold+dual", "tiny", {"strategy": "threshold", "cache": "dual"}),
    ("factor+dual", "tiny", {"strategy": "factor", "cache": "dual"}),
    ("entropy", "tiny", {"strategy": "entropy"}),
    ("d3llm", "tiny", {"strategy": "d3llm"}),
    ("d2f", "tiny-d2f", {"strategy": "d2f"}),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--model-d2f", default="tiny-d2f")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--block-length", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)

    from transformers.utils import logging as hf_logging

    from dllm.eval.tasks import get_suite, suite_names
    from dllm.loading import load_model, resolve_model_path
    from dllm.testing import HostReads
    from dllm.text import encode_prompts, load_tokenizer_for

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    models = {}
    for key, name in (("tiny", args.model), ("tiny-d2f", args.model_d2f)):
        path = resolve_model_path(name)
        models[key] = (load_model(path, device=args.device, dtype=args.dtype), load_tokenizer_for(path))
    prompts = [get_suite(s).examples("test", 1, seed=2)[0].prompt for s in suite_names()]
    acc = {label: {"total": 0.0, "forward": 0.0, "forwards": 0, "tokens": 0} for label, _, _ in STRATEGIES}
    for _ in range(args.repeats):
        for prompt in prompts:
            for label, key, overrides in STRATEGIES:
                model, tok = models[key]
                ids, mask = encode_prompts(tok, [prompt])
                # stop_at_eos off: every strategy decodes the full 256-token canvas, so the loops are timed at length
                out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                     block_length=args.block_length, stop_at_eos=False,
                                     return_dict_in_generate=True, **overrides)
                a = acc[label]
                a["total"] += out.timings["total_seconds"]
                a["forward"] += out.timings["forward_seconds"]
                a["forwards"] += int(out.num_forwards[0])
                a["tokens"] += args.new_tokens
    reads = {}
    for label, key, overrides in STRATEGIES:  # untimed: the counting mode slows every torch call
        model, tok = models[key]
        ids, mask = encode_prompts(tok, [prompts[0]])
        counter = HostReads()
        with counter:
            out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new_tokens,
                                 block_length=args.block_length, stop_at_eos=False, return_dict_in_generate=True,
                                 **overrides)
        reads[label] = counter.total / max(1, int(out.num_forwards[0]))
    rows = []
    print(f"{'strategy':<18} {'forward share':>13} {'forwards':>9} {'ms/forward':>11} {'overhead ms/step':>17} "
          f"{'host reads/fwd':>15}")
    for label, _, _ in STRATEGIES:
        a = acc[label]
        share = a["forward"] / a["total"] if a["total"] else 0.0
        ms_fwd = 1000 * a["forward"] / max(1, a["forwards"])
        ms_over = 1000 * (a["total"] - a["forward"]) / max(1, a["forwards"])
        rows.append({"strategy": label, "forward_share": share, "forwards": a["forwards"], "ms_per_forward": ms_fwd,
                     "overhead_ms_per_step": ms_over, "host_reads_per_forward": reads[label]})
        print(f"{label:<18} {100 * share:>12.1f}% {a['forwards']:>9} {ms_fwd:>11.2f} {ms_over:>17.2f} "
              f"{reads[label]:>15.1f}")
    print(f"batch=1 new_tokens={args.new_tokens} block={args.block_length} repeats={args.repeats} "
          f"torch_threads={torch.get_num_threads()} device={args.device or 'cpu'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"new_tokens": args.new_tokens, "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
