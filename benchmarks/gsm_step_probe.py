"""Where a model fails on the worked `gsm` problems: the arithmetic of each solution step, with the
step's operands given (docs/training.md, "Reading operands from the answer").

    python benchmarks/gsm_step_probe.py --model tiny --n 100

For step k, the reference solution up to and including step k's `=` is appended to the prompt and the
model decodes the rest greedily (vanilla); the probe checks the first number it writes, the step's
result. Step 1's operands come from the question; later steps' operands are earlier results, written
in the answer. A model that is right on step 1 and wrong on step 2 with the same operand sizes has not
learned to compute from numbers in its own answer, whatever its decoding order.
"""

from __future__ import annotations

import argparse
import re

import torch

STEP = re.compile(r"(\d+ [-+*] \d+ = )(\d+) \. ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--n", type=int, default=100, help="test problems")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from eval.tasks import get_suite
    from training.rollouts import encode_prompt, left_pad

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    base = model.diffusion_generation_config
    block = base.block_length or 32
    cfg = base.replace(strategy="vanilla", temperature=0.0, max_new_tokens=block, block_length=block,
                       mask_token_id=tok.mask_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, return_dict_in_generate=True)
    examples = get_suite("gsm").examples("test", args.n)
    print(f"{args.model}: step result right given the reference solution up to its '=' "
          f"({args.n} gsm test problems, torch threads {args.threads})")
    for k in range(3):
        rows, truth, ops = [], [], []
        for ex in examples:
            steps = STEP.findall(ex.answer)
            if len(steps) <= k:
                continue
            prefix = "".join(s + r + " . " for s, r in steps[:k]) + steps[k][0]
            rows.append(encode_prompt(tok, ex.prompt) + tok.encode(prefix.strip(), add_special_tokens=False))
            truth.append(int(steps[k][1]))
            ops.append(steps[k][0].split()[1])
        right: dict[str, list[int]] = {}
        for start in range(0, len(rows), args.batch_size):
            ids, mask = left_pad(rows[start:start + args.batch_size], tok.pad_token_id)
            with torch.no_grad():
                out = model.generate(ids, attention_mask=mask, generation_config=cfg, tokenizer=tok)
            for r in range(ids.shape[0]):
                text = tok.decode(out.sequences[r, ids.shape[1]:].tolist(), skip_special_tokens=True)
                m = re.match(r"\s*(\d+)", text)
                ok = bool(m) and int(m.group(1)) == truth[start + r]
                right.setdefault(ops[start + r], []).append(int(ok))
        total = [x for v in right.values() for x in v]
        per_op = ", ".join(f"'{op}' {sum(v)}/{len(v)}" for op, v in sorted(right.items()))
        print(f"  step {k + 1}: {sum(total)}/{len(total)} ({100 * sum(total) / max(1, len(total)):.0f}%)  [{per_op}]")


if __name__ == "__main__":
    main()
