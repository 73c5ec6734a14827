"""``chain``: 8-16 step running arithmetic with every intermediate result written (the long form of ``gsm``).

Prompt ``What is 12 + 7 then * 3 then - 5 ?`` (applied left to right, no precedence); answer in
``gsm``'s format, one equation per step and the result after ``####``:
``12 + 7 = 19 . 19 * 3 = 57 . 57 - 5 = 52 . #### 52``.

Every running total is a 2-digit number (10-99): ``+ b`` and ``- b`` take 2 <= b, ``* b`` takes
2 <= b <= 9; each step picks one of the operations that keep the total in range, uniformly. Steps
are 8 or 9 tokens and ``#### NN`` 6, so answers are 70 (8 steps) to 150 (16 steps) tokens long.

Correct: the integer after the last ``####`` (else the last integer) is the result, as in ``gsm``.
Reward: 1 when correct, else 0.5 * (leading reference equations written exactly) / steps: the steps
depend on each other, so the right prefix is what a wrong chain got right. ``details`` holds
``steps_right`` and ``leading_steps_accuracy`` (that prefix as a share of the steps), which
``dllm bench`` averages per suite as it does Sudoku's cell accuracy.
"""
from __future__ import annotations

import random

from .base import Example, Problem, Score, TaskSuite
from .gsm import extract_final_answer, solution_text, written_equations

MIN_STEPS, MAX_STEPS = 8, 16
LOW, HIGH = 10, 99  # every running total


def _apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def _next_step(total: int, rng: random.Random) -> tuple[str, int]:
    """One operation that keeps the running total in [LOW, HIGH], uniform over the feasible ones."""
    ranges = {"+": (2, HIGH - total), "-": (2, total - LOW), "*": (2, min(9, HIGH // total))}
    op = rng.choice([o for o, (lo, hi) in ranges.items() if lo <= hi])
    return op, rng.randint(*ranges[op])


class ChainSuite(TaskSuite):
    """Running arithmetic of 8-16 steps on 2-digit totals."""

    name = "chain"
    # "What is" (2) + 2-digit start + 16 steps of (then) op + up-to-2-digit operand + "?";
    # the first step has no "then"
    max_prompt_tokens = 2 + 2 + MAX_STEPS * 4 - 1 + 1
    # 16 equations of at most 2 + 1 + 2 + 1 + 2 + 1 tokens, then "#### NN" (each "#" is a token)
    max_answer_tokens = MAX_STEPS * 9 + 6

    def _draw(self, rng: random.Random) -> Problem:
        total = rng.randint(LOW, HIGH)
        ops = []
        steps = []
        for _ in range(rng.randint(MIN_STEPS, MAX_STEPS)):
            op, b = _next_step(total, rng)
            ops.append((op, b))
            steps.append((total, op, b))
            total = _apply(total, op, b)
        start = steps[0][0]
        prompt = f"What is {start} " + " then ".join(f"{op} {b}" for op, b in ops) + " ?"
        key = f"{start}|" + ",".join(f"{op}{b}" for op, b in ops)
        meta = {"answer": total, "n_steps": len(steps), "steps": [list(s) for s in steps]}
        return Problem(key, prompt, solution_text(steps), meta)

    def category(self, example: Example) -> str:
        """The number of steps (``8 steps`` to ``16 steps``)."""
        return f"{example.meta['n_steps']} steps"

    def score(self, example: Example, completion: str) -> Score:
        """Correct iff the final result is right; partial credit for the right leading equations."""
        got = extract_final_answer(completion)
        gold = example.meta["answer"]
        ok = got is not None and got == gold
        n_steps = example.meta["n_steps"]
        prefix = 0
        for written, (a, op, b) in zip(written_equations(completion), example.meta["steps"]):
            if written != (a, op, b, _apply(a, op, b)):
                break
            prefix += 1
        reward = 1.0 if ok else 0.5 * prefix / n_steps
        return Score(ok, reward, {"parsed": got, "gold": gold, "steps_right": prefix,
                                  "leading_steps_accuracy": prefix / n_steps})
