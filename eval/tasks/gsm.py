"""``gsm``: GSM-style 2-3 step word problems from fixed templates; answers end in ``#### N``."""
from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from .base import Example, Problem, Score, TaskSuite, all_ints
from .words import NAMES, NOUNS

Step = tuple[int, str, int]  # (left, op, right); the result is computed


def _apply(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


@dataclass(frozen=True)
class Template:
    """A word problem: its text, how to draw its numbers, and its solution steps."""

    name: str
    text: str  # format fields: {A} {B} {C} names, {N} noun, plus the number fields
    draw: Callable[[random.Random], dict[str, int]]
    steps: Callable[[dict[str, int]], list[Step]]


def _draw_buy_give(r: random.Random) -> dict[str, int]:
    x, y = r.randint(5, 60), r.randint(2, 40)
    return {"x": x, "y": y, "z": r.randint(1, x + y)}


def _draw_boxes(r: random.Random) -> dict[str, int]:
    x, y = r.randint(2, 9), r.randint(2, 12)
    return {"x": x, "y": y, "z": r.randint(1, x * y)}


def _draw_shop(r: random.Random) -> dict[str, int]:
    y, z = r.randint(2, 9), r.randint(2, 12)
    return {"x": y * z + r.randint(0, 50), "y": y, "z": z}


def _draw_times_fewer(r: random.Random) -> dict[str, int]:
    x, k = r.randint(2, 20), r.randint(2, 5)
    return {"x": x, "k": k, "y": r.randint(1, x * k - 1)}


def _draw_box_take(r: random.Random) -> dict[str, int]:
    x = r.randint(20, 99)
    y = r.randint(1, x - 1)
    return {"x": x, "y": y, "z": r.randint(1, x - y), "w": r.randint(1, 50)}


def _draw_days(r: random.Random) -> dict[str, int]:
    x, d = r.randint(2, 12), r.randint(2, 9)
    return {"x": x, "d": d, "y": r.randint(1, x * d), "z": r.randint(1, 20)}


def _draw_gets_loses(r: random.Random) -> dict[str, int]:
    x, y, z = r.randint(2, 50), r.randint(1, 30), r.randint(1, 30)
    return {"x": x, "y": y, "z": z, "w": r.randint(1, x + y + z)}


def _chain(start: int, *ops: tuple[str, int]) -> list[Step]:
    """Steps of a running total: ``start op1 n1 = t1 ; t1 op2 n2 = t2 ; ...``."""
    steps, total = [], start
    for op, n in ops:
        steps.append((total, op, n))
        total = _apply(total, op, n)
    return steps


TEMPLATES: tuple[Template, ...] = (
    Template(
        "buy_give",
        "{A} has {x} {N} . {A} buys {y} more and gives {z} to {B} . How many {N} does {A} have now ?",
        _draw_buy_give,
        lambda v: _chain(v["x"], ("+", v["y"]), ("-", v["z"])),
    ),
    Template(
        "boxes",
        "{A} has {x} boxes with {y} {N} in each box . {A} gives {z} {N} to {B} . "
        "How many {N} does {A} have now ?",
        _draw_boxes,
        lambda v: _chain(v["x"], ("*", v["y"]), ("-", v["z"])),
    ),
    Template(
        "shop",
        "{A} has {x} coins . {A} buys {y} {N} that cost {z} coins each . How many coins does {A} have left ?",
        _draw_shop,
        lambda v: [(v["y"], "*", v["z"]), (v["x"], "-", v["y"] * v["z"])],
    ),
    Template(
        "more_than",
        "{A} has {x} {N} . {B} has {y} more {N} than {A} . How many {N} do {A} and {B} have together ?",
        lambda r: {"x": r.randint(3, 60), "y": r.randint(1, 40)},
        lambda v: [(v["x"], "+", v["y"]), (v["x"], "+", v["x"] + v["y"])],
    ),
    Template(
        "times_fewer",
        "{A} has {x} {N} . {B} has {k} times as many {N} as {A} . {C} has {y} fewer {N} than {B} . "
        "How many {N} do {B} and {C} have together ?",
        _draw_times_fewer,
        lambda v: [
            (v["x"], "*", v["k"]),
            (v["x"] * v["k"], "-", v["y"]),
            (v["x"] * v["k"], "+", v["x"] * v["k"] - v["y"]),
        ],
    ),
    Template(
        "box_take",
        "There are {x} {N} in a box . {A} takes {y} and {B} takes {z} . Then {C} puts {w} more in the box . "
        "How many {N} are in the box now ?",
        _draw_box_take,
        lambda v: _chain(v["x"], ("-", v["y"]), ("-", v["z"]), ("+", v["w"])),
    ),
    Template(
        "days",
        "{A} picks {x} {N} each day for {d} days . {A} gives {y} {N} to {B} and then finds {z} more . "
        "How many {N} does {A} have now ?",
        _draw_days,
        lambda v: _chain(v["x"], ("*", v["d"]), ("-", v["y"]), ("+", v["z"])),
    ),
    Template(
        "bags",
        "{A} buys {k} bags with {x} {N} in each bag . {A} already had {y} {N} . How many {N} does {A} have now ?",
        lambda r: {"k": r.randint(2, 9), "x": r.randint(2, 15), "y": r.randint(1, 60)},
        lambda v: _chain(v["k"], ("*", v["x"]), ("+", v["y"])),
    ),
    Template(
        "gets_loses",
        "{A} has {x} {N} . {A} gets {y} more from {B} and {z} more from {C} , then loses {w} . "
        "How many {N} does {A} have now ?",
        _draw_gets_loses,
        lambda v: _chain(v["x"], ("+", v["y"]), ("+", v["z"]), ("-", v["w"])),
    ),
)


def solution_text(steps: list[Step]) -> str:
    """``12 + 7 = 19 . 19 - 5 = 14 . #### 14``"""
    parts, result = [], 0
    for a, op, b in steps:
        result = _apply(a, op, b)
        parts.append(f"{a} {op} {b} = {result} .")
    return " ".join(parts) + f" #### {result}"


_EQUATION_RE = re.compile(r"(-?\d+) ([-+*]) (-?\d+) = (-?\d+)")
Equation = tuple[int, str, int, int]  # a op b = c, as written (c may be wrong)


def written_equations(completion: str) -> list[Equation]:
    """Every ``a op b = c`` in the text, in order."""
    return [(int(a), op, int(b), int(c)) for a, op, b, c in _EQUATION_RE.findall(completion)]


def equation_is_right(eq: Equation) -> bool:
    a, op, b, c = eq
    return _apply(a, op, b) == c


def grounded_correct_steps(prompt: str, completion: str) -> int:
    """Distinct written equations ``a op b = c`` that are arithmetically right and use known numbers.

    A number is known once it is in the question or is the result of an earlier counted equation,
    so an equation made up of unrelated numbers (``1 + 1 = 2``) earns nothing, and writing the same
    right equation twice counts once.
    """
    known = set(all_ints(prompt))
    counted: set[tuple[int, str, int]] = set()
    for a, op, b, c in written_equations(completion):
        if a in known and b in known and equation_is_right((a, op, b, c)):
            counted.add((a, op, b))
            known.add(c)
    return len(counted)


def extract_final_answer(completion: str) -> int | None:
    """Integer after the last ``####``; falls back to the last integer in the text."""
    if "####" in completion:
        after = all_ints(completion.rsplit("####", 1)[1])
        if after:
            return after[0]
    ints = all_ints(completion)
    return ints[-1] if ints else None


class GsmSuite(TaskSuite):
    """Templated arithmetic word problems; every intermediate value is in [0, 999]."""

    name = "gsm"
    # Prompt: every template rendered with each number at its largest digit count; the longest is
    # box_take (38). Answer: exhaustive enumeration of every template's number ranges gives 37
    # (times_fewer, days, gets_loses). TaskSuite._check_budget re-checks every generated example.
    max_prompt_tokens = 38
    max_answer_tokens = 37

    def _draw(self, rng: random.Random) -> Problem:
        t = rng.choice(TEMPLATES)
        values = t.draw(rng)
        a, b, c = rng.sample(NAMES, 3)
        noun = rng.choice(NOUNS)
        steps = t.steps(values)
        answer = solution_text(steps)
        gold = _apply(*steps[-1])
        # names and noun do not change the maths, so they are not part of the key
        key = t.name + "|" + ",".join(f"{k}={values[k]}" for k in sorted(values))
        prompt = t.text.format(A=a, B=b, C=c, N=noun, **values)
        meta = {"template": t.name, "answer": gold, "n_steps": len(steps)}
        return Problem(key, prompt, answer, meta)

    def category(self, example: Example) -> str:
        """The number of solution steps (``2 steps``, ``3 steps``)."""
        return f"{example.meta['n_steps']} steps"

    def score(self, example: Example, completion: str) -> Score:
        """Correct iff the integer after the last ``####`` (else the last integer) equals the gold.

        ``reward``: 1 when correct, else partial credit 0.5 x (grounded, arithmetically right
        equations, at most the reference's step count) / step count. Most wrong answers of the
        small models are one slip in an otherwise right chain, which a 0/1 reward cannot tell
        apart from a wrong chain; stopping early earns no more than a full chain with one slip.
        """
        got = extract_final_answer(completion)
        ok = got is not None and got == example.meta["answer"]
        n_steps = example.meta["n_steps"]
        steps = min(grounded_correct_steps(example.prompt, completion), n_steps)
        reward = 1.0 if ok else 0.5 * steps / n_steps
        return Score(ok, reward, {"parsed": got, "gold": example.meta["answer"], "correct_steps": steps})
