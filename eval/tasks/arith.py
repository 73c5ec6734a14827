"""``arith``: addition and subtraction of up-to-3-digit integers, plus 1-digit x 2-digit products."""
from __future__ import annotations

import random

from .base import Example, Problem, Score, TaskSuite, first_int

OP_WEIGHTS: tuple[tuple[str, float], ...] = (("+", 0.4), ("-", 0.4), ("*", 0.2))


def _operand(rng: random.Random) -> int:
    """Up-to-3-digit operand with a uniformly chosen digit count (so small numbers are common)."""
    digits = rng.randint(1, 3)
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


class ArithSuite(TaskSuite):
    """Prompt ``What is 123 + 45 ?``; answer ``168``. Subtraction results are never negative."""

    name = "arith"
    # "What is" (2) + 3 digits + op + 3 digits + "?" = 10
    max_prompt_tokens = 10
    # at most 999 + 999 = 1998 -> 4 digits
    max_answer_tokens = 4

    def _draw(self, rng: random.Random) -> Problem:
        op = rng.choices([o for o, _ in OP_WEIGHTS], weights=[w for _, w in OP_WEIGHTS])[0]
        if op == "*":
            a, b = rng.randint(2, 9), rng.randint(2, 99)
            if rng.random() < 0.5:
                a, b = b, a
            value = a * b
        else:
            a, b = _operand(rng), _operand(rng)
            if op == "-" and a < b:
                a, b = b, a
            value = a + b if op == "+" else a - b
        return Problem(
            # commutative ops share one key, so "3 * 45" and "45 * 3" land in the same split
            key=f"{min(a, b)}{op}{max(a, b)}" if op in "+*" else f"{a}{op}{b}",
            prompt=f"What is {a} {op} {b} ?",
            answer=str(value),
            meta={"op": op, "a": a, "b": b, "answer": value},
        )

    def category(self, example: Example) -> str:
        """The operator and the widest operand's digit count: ``+3`` (up to 3-digit addition), ``-2``, ``*2``."""
        m = example.meta
        return f"{m['op']}{max(len(str(m['a'])), len(str(m['b'])))}"

    def score(self, example: Example, completion: str) -> Score:
        """Correct iff the first integer in the completion equals the result."""
        got = first_int(completion)
        ok = got is not None and got == example.meta["answer"]
        return Score(ok, 1.0 if ok else 0.0, {"parsed": got, "gold": example.meta["answer"]})
