"""Does a model exclude names already written? Probability it puts on them in `shuffle` answers.

A `shuffle` answer is a permutation of the prompt's names, so once a name is visible in the
answer, no other answer slot should hold it. This probe takes the first N `shuffle` test problems
of the lists suite, writes the reference answer, masks it with D2F's monotone per-block ratios
(the distillation recipe's noise: ``--pmask-low``/``--pmask-high``, blocks of ``--block-size``) and
reports, over the masked name slots that have at least one visible name in their row, the mean
probability each model puts on the visible names. A model that ignored the answer would put about
``visible / names`` there (printed as ``ignore-answer level``); one that excludes puts close to 0.
Every model runs with its own attention policy (``tiny`` bidirectional, ``tiny-d2f`` block-causal),
on the same noised canvases, encoded with the first model's tokenizer (the models must share it, as
a teacher and its distilled students do).

    python benchmarks/exclusion_probe.py --models tiny,tiny-d2f --n 400
"""

from __future__ import annotations

import argparse

import torch


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,tiny-d2f", help="comma-separated model names or paths")
    ap.add_argument("--n", type=int, default=400, help="test problems of the lists suite drawn before keeping `shuffle`")
    ap.add_argument("--pmask-low", type=float, default=0.0)
    ap.add_argument("--pmask-high", type=float, default=1.0)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--canvas", type=int, default=16, help="answer slots; at least block size + 2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite
    from training.data import collate, encode_answer, encode_prompt
    from training.objectives import d2f_noise

    if args.canvas < args.block_size + 2:
        raise SystemExit(f"--canvas {args.canvas} is too short: it needs at least --block-size + 2 "
                         f"= {args.block_size + 2} answer slots")
    hf_logging.disable_progress_bar()
    names = [m for m in args.models.split(",") if m]
    tok = load_tokenizer(resolve_model_path(names[0]))
    suite = get_suite("lists")
    examples = [e for e in suite.examples("test", args.n) if suite.category(e) == "shuffle"]
    if not examples:
        raise SystemExit(f"no shuffle problems among the first {args.n} test problems; raise --n")
    pairs = [(encode_prompt(tok, e.prompt), encode_answer(tok, e.answer)) for e in examples]
    batch = collate(pairs, args.canvas, tok.pad_token_id, tok.eos_token_id)
    p = batch.prompt_length
    noisy, masked, _ = d2f_noise(batch.input_ids, p, args.block_size, batch.answer_mask, tok.mask_token_id,
                                 torch.Generator().manual_seed(args.seed), args.pmask_low, args.pmask_high)
    # (row, slot, visible name ids, number of names) for every masked name slot with a visible name
    probes = []
    for i, (_, answer) in enumerate(pairs):
        n_names = len(answer) - 1  # the answer is the names plus one EOS
        slots = range(p, p + n_names)
        visible = sorted({int(noisy[i, s]) for s in slots if not masked[i, s]})
        if visible:
            probes += [(i, s, visible, n_names) for s in slots if masked[i, s]]
    if not probes:
        raise SystemExit("no masked slot has a visible name in its row; raise --n or lower --pmask-low")
    ignore = sum(len(v) / n for _, _, v, n in probes) / len(probes)
    print(f"{len(examples)} shuffle problems, {len(probes)} masked name slots with a visible name in their row "
          f"(noise: monotone per-block ratios from U[{args.pmask_low}, {args.pmask_high}), blocks of "
          f"{args.block_size}); ignore-answer level {ignore:.3f}")
    # Can slots 1-3 of the first answer block see slot 0 at all? Logit change when one token is written
    # into a fully masked answer at slot 0 (same block) or at slot block_size + 1 (the next block).
    row = batch.input_ids[:1].clone()
    row[0, p:] = tok.mask_token_id
    same, nxt = row.clone(), row.clone()
    same[0, p] = batch.input_ids[0, p]
    nxt[0, p + args.block_size + 1] = batch.input_ids[0, p]
    result = {"ignore_level": ignore, "slots": len(probes), "problems": len(examples), "models": {},
              "sensitivity": {}}
    for name in names:
        model = load_model(name).eval()
        with torch.no_grad():
            probs = model(noisy, attention_mask=batch.attention_mask, prompt_length=p).logits.float().softmax(-1)
            base, l_same, l_next = (model(x, attention_mask=batch.attention_mask[:1], prompt_length=p).logits.float()
                                    [0, p + 1:p + 4] for x in (row, same, nxt))
        mass = sum(float(probs[i, s, v].sum()) for i, s, v, _ in probes) / len(probes)
        policy = getattr(model.config, "attention_policy", None) or "bidirectional"
        sens = (float((l_same - base).abs().max()), float((l_next - base).abs().max()))
        result["models"][name] = mass
        result["sensitivity"][name] = sens
        print(f"  {name:24s} ({policy}): mean probability on names already visible {mass:.3f}; "
              f"max logit change at answer slots 1-3 when slot 0 is written {sens[0]:.2f}, "
              f"when slot {args.block_size + 1} (next block) is written {sens[1]:.2f}")
    return result


if __name__ == "__main__":
    main()
