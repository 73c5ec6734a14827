"""Training-step time on CPU with the ``sdpa`` and ``eager`` attention backends, side by side.

One SFT step as `dllm train sft` runs it (LLaDA noising, forward, loss, backward, AdamW) on the
bundled model, with one micro-batch per suite drawn from the training stream, alternating the two
backends so that both see the same machine load. At the bundled models' sizes (head dim 32,
sequences under 130 tokens) SDPA's CPU flash-attention backward dominates a bf16 step; the eager
backend (explicit matmuls, float32 softmax) is what ``auto`` picks for CPU training forwards.

    python benchmarks/attention_backward.py --threads 2 --precision bf16,fp32
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

from dllm.eval.outputs import check_output_args


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="bf16,fp32")
    ap.add_argument("--rounds", type=int, default=3, help="alternations per backend")
    ap.add_argument("--steps", type=int, default=5, help="micro-batches per suite and round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    check_output_args(ap, args.json)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from dllm.training.config import DataSection
    from dllm.training.data import TaskStream
    from dllm.training.objectives import sft_loss, sft_noise

    hf_logging.disable_progress_bar()
    model = load_model(args.model).train()
    tok = load_tokenizer(resolve_model_path(args.model))
    suites = ["arith", "lists", "gsm", "sudoku", "countdown"]
    batches = []
    for name in suites:
        stream = TaskStream(tok, DataSection(tasks={name: 1.0}, max_new_tokens=64), args.batch_size, seed=0)
        batches.append(stream.next_batch())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gen = torch.Generator().manual_seed(0)

    def step(batch, backend, precision):
        noisy, masked, p_mask = sft_noise(batch.input_ids, batch.answer_mask, tok.mask_token_id, gen, 1e-3, 0.5, 0.5)
        p = batch.prompt_length
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with ctx:
            logits = model(noisy, attention_mask=batch.attention_mask, prompt_length=p,
                           logits_range=(p, noisy.shape[1]), attn_backend=backend).logits
            loss = sft_loss(logits, batch.input_ids[:, p:], masked[:, p:], p_mask[:, p:], batch.answer_mask.sum(1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    tokens = sum(int(b.attention_mask.sum()) for b in batches) * args.steps
    result = {"model": args.model, "batch_size": args.batch_size, "torch_threads": torch.get_num_threads(),
              "device": "cpu", "results": {}}
    print(f"{args.model}: SFT step (fwd+bwd+AdamW), micro-batch {args.batch_size}, one per suite, "
          f"torch threads {torch.get_num_threads()}")
    for precision in args.precision.split(","):
        times = {"sdpa": [], "eager": []}
        for b in batches:  # warm-up
            step(b, "sdpa", precision)
            step(b, "eager", precision)
        for _ in range(args.rounds):
            for backend in times:
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    for b in batches:
                        step(b, backend, precision)
                times[backend].append(time.perf_counter() - t0)
        row = {k: {"ms_per_micro_batch": 1000 * min(v) / (args.steps * len(batches)),
                   "tokens_per_second": tokens / min(v)} for k, v in times.items()}
        row["speedup"] = min(times["sdpa"]) / min(times["eager"])
        result["results"][precision] = row
        print(f"  {precision}: sdpa {row['sdpa']['ms_per_micro_batch']:.1f} ms "
              f"({row['sdpa']['tokens_per_second']:.0f} tok/s), eager {row['eager']['ms_per_micro_batch']:.1f} ms "
              f"({row['eager']['tokens_per_second']:.0f} tok/s): eager x{row['speedup']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
