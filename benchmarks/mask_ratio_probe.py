"""How well a model fills masks as a function of how many are left: one forward per mask ratio.

Vanilla decoding walks a canvas from all-masked to one mask left. A model trained only on heavily
masked canvases (SFT option ``t_min`` 0.5) never sees the late states. This probe takes the
first N test problems of a suite, writes the reference answer (EOS-padded to the canvas), masks
a fraction t of it i.i.d. and reports, over the masked answer tokens (the EOS padding excluded,
the first EOS included), the greedy accuracy and cross-entropy, and the share of rows with at
least one wrong masked token. Two modes: ``all`` masks the whole answer region, ``eos_revealed``
masks only answer tokens and leaves the EOS padding visible (the state vanilla decoding reaches
after committing the confident EOS tail first).

    python benchmarks/mask_ratio_probe.py --model tiny --suite lists --categories copy,reverse,sort
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--suite", default="lists")
    ap.add_argument("--categories", default=None, help="comma-separated categories of the suite (default: all)")
    ap.add_argument("--n", type=int, default=400, help="test problems drawn before the category filter")
    ap.add_argument("--ratios", default="0.1,0.25,0.5,0.75,1.0")
    ap.add_argument("--canvas", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite
    from training.data import collate, encode_answer, encode_prompt

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    suite = get_suite(args.suite)
    cats = set(args.categories.split(",")) if args.categories else None
    examples = [e for e in suite.examples("test", args.n) if cats is None or suite.category(e) in cats]
    if not examples:
        raise SystemExit(f"no test problems of {args.suite} in categories {sorted(cats or [])}")
    pairs = [(encode_prompt(tok, e.prompt), encode_answer(tok, e.answer)) for e in examples]
    batch = collate(pairs, args.canvas, tok.pad_token_id, tok.eos_token_id)
    p = batch.prompt_length
    content = batch.answer_mask & (batch.input_ids != tok.eos_token_id)
    for i, (_, answer) in enumerate(pairs):
        content[i, p + len(answer) - 1] = True  # the first EOS is part of the answer
    gen = torch.Generator().manual_seed(0)
    result: dict = {}
    print(f"{args.model} on {args.suite} {sorted(cats) if cats else ''} ({len(examples)} test problems, canvas "
          f"{args.canvas}): masked answer tokens, greedy accuracy / cross-entropy / rows with an error")
    for mode in ("all", "eos_revealed"):
        for t in (float(r) for r in args.ratios.split(",")):
            draw = torch.rand(batch.input_ids.shape, generator=gen) < t
            masked = draw & (batch.answer_mask if mode == "all" else content)
            noisy = batch.input_ids.masked_fill(masked, tok.mask_token_id)
            with torch.no_grad():
                logits = model(noisy, attention_mask=batch.attention_mask).logits
            sel = masked & content
            target = batch.input_ids[sel]
            acc = (logits.argmax(-1)[sel] == target).float().mean().item()
            ce = F.cross_entropy(logits[sel].float(), target).item()
            rows = ((logits.argmax(-1) != batch.input_ids) & sel).any(1).float().mean().item()
            result[(mode, t)] = {"accuracy": 100 * acc, "ce": ce, "rows_with_error": 100 * rows}
            print(f"  {mode:12s} t={t:.2f}  acc {100 * acc:6.2f}%  ce {ce:.4f}  rows with an error {100 * rows:5.1f}%")
    return result


if __name__ == "__main__":
    main()
