"""A quick accuracy probe for training runs: greedy, one token per forward, on test examples (the
trainers' in-run evaluation; ``python -m dllm.training.monitor`` runs it from the command line).

This is a monitoring aid, not the project's decoder (that lives in ``decoding/``): each step
predicts every masked answer slot and commits the single most confident one (restricted to the
earliest block that still has masks when ``block_size`` is given, i.e. semi-autoregressive
block decoding, which is also what a block-causal D2F student needs).
"""

from __future__ import annotations

import torch

from .data import encode_prompt


@torch.no_grad()
def greedy_unmask(model, prompts: list[list[int]], gen_length: int, mask_id: int, pad_id: int,
                  block_size: int | None = None) -> list[list[int]]:
    device = next(model.parameters()).device
    b, p = len(prompts), max(len(q) for q in prompts)
    ids = torch.full((b, p + gen_length), mask_id, dtype=torch.long)
    attn = torch.ones_like(ids)
    for i, q in enumerate(prompts):
        ids[i, : p - len(q)] = pad_id
        attn[i, : p - len(q)] = 0
        ids[i, p - len(q) : p] = torch.tensor(q)
    ids, attn = ids.to(device), attn.to(device)
    block_of = torch.arange(gen_length, device=device) // (block_size or gen_length)
    for _ in range(gen_length):
        answer = ids[:, p:]
        masked = answer == mask_id
        if not bool(masked.any()):
            break
        logits = model(ids, attention_mask=attn, prompt_length=p, logits_range=(p, p + gen_length)).logits.float()
        logits[..., mask_id] = float("-inf")
        conf, tok = logits.softmax(-1).max(-1)
        # earliest block with a mask, per row: only it may be filled (semi-AR / block-causal order)
        first = torch.where(masked, block_of[None].expand_as(masked), gen_length).min(dim=1).values
        allowed = masked & (block_of[None] == first[:, None])
        conf = torch.where(allowed, conf, torch.full_like(conf, -1.0))
        pos = conf.argmax(dim=1)
        rows = torch.nonzero(allowed.any(dim=1)).flatten()
        ids[rows, p + pos[rows]] = tok[rows, pos[rows]]
    return ids[:, p:].tolist()


def completion_text(tokenizer, answer_ids: list[int]) -> str:
    eos = tokenizer.eos_token_id
    if eos in answer_ids:
        answer_ids = answer_ids[: answer_ids.index(eos)]
    return tokenizer.decode(answer_ids, skip_special_tokens=True)


def evaluate(model, tokenizer, suites: list, n: int, gen_length: int, block_size: int | None = None,
             batch_size: int = 64, seed: int = 0, return_details: bool = False, should_stop=None):
    """Accuracy per suite (``correct`` of the suite's scorer) on the first ``n`` test examples.
    ``suites``: names, or suites built with their options (``resolve_suites("longlists:max_items=12")``).

    ``should_stop`` (a callable, checked before each batch): when it answers True the evaluation ends
    there and only the suites scored in full are returned (a run asked to stop does not wait for it)."""
    from dllm.eval.tasks import get_suite

    was_training = model.training
    model.eval()
    scores, details = {}, {}
    try:
        for suite in suites:
            suite = get_suite(suite) if isinstance(suite, str) else suite
            name = suite.name
            exs = suite.examples("test", n, seed=seed)
            correct, rows = 0, []
            for i in range(0, len(exs), batch_size):
                if should_stop is not None and should_stop():
                    return (scores, details) if return_details else scores
                chunk = exs[i : i + batch_size]
                outs = greedy_unmask(model, [encode_prompt(tokenizer, e.prompt) for e in chunk], gen_length,
                                     tokenizer.mask_token_id, tokenizer.pad_token_id, block_size)
                for e, out in zip(chunk, outs):
                    text = completion_text(tokenizer, out)
                    ok = suite.score(e, text).correct
                    correct += int(ok)
                    rows.append((e.prompt, e.answer, text, ok))
            scores[name] = correct / max(1, len(exs))
            details[name] = rows
    finally:
        model.train(was_training)
    return (scores, details) if return_details else scores
