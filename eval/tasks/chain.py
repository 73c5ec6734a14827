"""``chain``: 2-3 step arithmetic expressions solved step by step in ``gsm``'s answer format.

A training suite (not in ``"all"``): it exists to teach a small model the skill the ``gsm`` suite
needs and the other suites never train, computing with an operand that the answer itself wrote
earlier. ``benchmarks/gsm_failures.py`` found that almost every wrong ``gsm`` answer of the bundled
models is such a slip: ``arith`` (operands in the prompt) is right 99% of the time, a ``gsm`` step
whose operand is an earlier result about half of the time. Every prompt uses only words already
in the ``gsm``/``arith`` vocabulary, so adding it to a run does not change the tokenizer.

>>> from eval.tasks import get_suite
>>> ex = get_suite("chain").examples("train", 1)[0]
>>> get_suite("chain").score(ex, ex.answer).correct
True
"""
from __future__ import annotations

import random

from .base import Example, Problem, Score, TaskSuite
from .gsm import Step, _apply, extract_final_answer, solution_text

_MAX_VALUE = 999  # every operand and intermediate result, as in gsm


def _small(rng: random.Random) -> int:
    return rng.randint(1, 99) if rng.random() < 0.8 else rng.randint(100, 400)


def _plus_minus(rng: random.Random, total: int) -> tuple[str, int]:
    """An addition or subtraction that keeps the running total in [0, 999]."""
    for _ in range(100):
        op, n = rng.choice("+-"), _small(rng)
        if 0 <= _apply(total, op, n) <= _MAX_VALUE:
            return op, n
    return "-", rng.randint(0, total)


def _product(rng: random.Random) -> tuple[int, int]:
    return rng.randint(2, 12), rng.randint(2, 15)


class ChainSuite(TaskSuite):
    """Prompt ``What is 9 * 14 + 36 ?``; answer ``9 * 14 = 126 . 126 + 36 = 162 . #### 162``.

    Four shapes, all evaluated with the usual precedence: a running total (``a + b - c``), a product
    first (``a * b - c + d``), a product subtracted from or added to a number (``c - a * b``: the
    earlier result is the right operand, as in gsm's ``shop`` problems) and a bracket first
    (``a + ( a + b )``, as in gsm's ``more_than``).
    """

    name = "chain"
    # "What is" + up to four 3-digit numbers, three operators, a bracket pair and "?"
    max_prompt_tokens = 20
    # three steps "aaa op bbb = ccc ." (12 tokens each) + "####" (4) + "ccc"
    max_answer_tokens = 43

    def _draw(self, rng: random.Random) -> Problem:
        n_steps = 2 if rng.random() < 0.6 else 3
        shape = rng.choices(["total", "product_first", "product_right", "bracket"], weights=[3, 3, 2, 2])[0]
        steps: list[Step] = []
        if shape in ("total", "product_first"):
            if shape == "total":
                total = rng.randint(2, 99) if rng.random() < 0.7 else rng.randint(100, 500)
                text = str(total)
            else:
                a, b = _product(rng)
                steps.append((a, "*", b))
                total, text = a * b, f"{a} * {b}"
            while len(steps) < n_steps:
                op, n = _plus_minus(rng, total)
                steps.append((total, op, n))
                total = _apply(total, op, n)
                text += f" {op} {n}"
        elif shape == "product_right":
            a, b = _product(rng)
            p = a * b
            op = rng.choice("+-")
            c = rng.randint(p, min(p + 150, _MAX_VALUE)) if op == "-" else rng.randint(1, _MAX_VALUE - p)
            steps = [(a, "*", b), (c, op, p)]
            total, text = _apply(c, op, p), f"{c} {op} {a} * {b}"
            if n_steps == 3:
                op, n = _plus_minus(rng, total)
                steps.append((total, op, n))
                total = _apply(total, op, n)
                text += f" {op} {n}"
        else:
            x, y = rng.randint(3, 99), rng.randint(1, 99)
            inner = rng.choice("+-")
            if inner == "-" and y > x:
                x, y = y, x
            t = _apply(x, inner, y)
            outer = "+" if rng.random() < 0.7 or t > x else "-"
            steps = [(x, inner, y), (x, outer, t)]
            total, text = _apply(x, outer, t), f"{x} {outer} ( {x} {inner} {y} )"
            if n_steps == 3:
                op, n = _plus_minus(rng, total)
                steps.append((total, op, n))
                total = _apply(total, op, n)
                text += f" {op} {n}"
        prompt = f"What is {text} ?"
        meta = {"shape": shape, "answer": total, "n_steps": len(steps)}
        # the expression is the problem: same text, same key
        return Problem(text, prompt, solution_text(steps), meta)

    def category(self, example: Example) -> str:
        """The expression's shape (``total``, ``product_first``, ``product_right``, ``bracket``)."""
        return example.meta["shape"]

    def score(self, example: Example, completion: str) -> Score:
        """Correct iff the integer after the last ``####`` (else the last integer) equals the value."""
        got = extract_final_answer(completion)
        ok = got is not None and got == example.meta["answer"]
        return Score(ok, 1.0 if ok else 0.0, {"parsed": got, "gold": example.meta["answer"]})
