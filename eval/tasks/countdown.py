"""``countdown``: combine 3 numbers (1-20), each exactly once, with + - * / to hit a target.

Prompt ``numbers 3 5 7 target 22 :``; answer ``3 * 5 + 7``. The reference answer is the first
solution of a fixed enumeration over the sorted numbers (so it depends only on the problem key);
its intermediate values are non-negative integers and its divisions are exact.

The answer may also be written as steps, the way the game is played: ``3 * 5 = 15 , 15 + 7 = 22``
(one line, steps separated by commas; each step combines two numbers still available, the given
ones or earlier results, and its result becomes available). A steps line is scored like the
expression it spells out, and every claimed result must be exact. A *chain* writes each result only
once and carries it into the next operation, the way a calculator tape reads: ``3 * 5 = 15 + 7 = 22``
(the final ``= target`` may be left off); it is scored exactly like the steps it abbreviates.

Scoring (d1-style): 1.0 if the expression uses exactly the given numbers (as a multiset) and
equals the target; 0.1 if it is a well-formed expression that fails (wrong value, wrong numbers,
inexact division, a step whose claimed result is wrong); 0.0 if no well-formed expression can be
read. ``correct`` iff reward == 1.
"""
from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from .base import Example, Problem, Score, TaskSuite
from .expression import ExpressionSyntaxError, ExpressionValueError, evaluate, parse_expression, parse_tree

N_NUMBERS, MIN_NUMBER, MAX_NUMBER = 3, 1, 20
MIN_TARGET, MAX_TARGET = 1, 100
OPS = "+-*/"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}
_EXPR_PREFIX_RE = re.compile(r"[0-9+\-*/()\s]*")


def _apply(a: int, op: str, b: int) -> int | None:
    """Exact, non-negative result or None (Countdown rules for generated answers)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


def _render_left(a: int, o1: str, b: int, o2: str, c: int) -> str:
    """``(a o1 b) o2 c`` with the parentheses only where precedence needs them."""
    inner = f"{a} {o1} {b}"
    return f"( {inner} ) {o2} {c}" if _PREC[o1] < _PREC[o2] else f"{inner} {o2} {c}"


def _render_right(a: int, o1: str, b: int, o2: str, c: int) -> str:
    """``a o1 (b o2 c)`` with the parentheses only where precedence/associativity need them."""
    inner = f"{b} {o2} {c}"
    needs = _PREC[o2] < _PREC[o1] or (_PREC[o2] == _PREC[o1] and o1 in "-/")
    return f"{a} {o1} ( {inner} )" if needs else f"{a} {o1} {inner}"


@lru_cache(maxsize=4096)
def all_solutions(numbers: tuple[int, ...]) -> dict[int, tuple[str, ...]]:
    """target -> every distinct expression over the numbers that reaches it, in enumeration order.

    Order: permutations of ``numbers`` as given, then shape ``(a o b) o c`` before ``a o (b o c)``,
    then operators in the order ``+ - * /``.
    """
    table: dict[int, list[str]] = {}
    for a, b, c in dict.fromkeys(itertools.permutations(numbers)):
        for o1, o2 in itertools.product(OPS, repeat=2):
            v1 = _apply(a, o1, b)
            v = None if v1 is None else _apply(v1, o2, c)
            if v is not None:
                table.setdefault(v, []).append(_render_left(a, o1, b, o2, c))
            w1 = _apply(b, o2, c)
            w = None if w1 is None else _apply(a, o1, w1)
            if w is not None:
                table.setdefault(w, []).append(_render_right(a, o1, b, o2, c))
    return {t: tuple(dict.fromkeys(exprs)) for t, exprs in table.items()}


@lru_cache(maxsize=4096)
def solutions(numbers: tuple[int, ...]) -> dict[int, str]:
    """target -> canonical (first) expression; the suite passes the numbers sorted."""
    return {t: exprs[0] for t, exprs in all_solutions(numbers).items()}


@lru_cache(maxsize=65536)
def _first_chain(numbers: tuple[int, ...], target: int) -> str | None:
    """The chain of the first solution in enumeration order that has one."""
    return next((c for e in all_solutions(numbers).get(target, ()) if (c := render_chain(e))), None)


_STEP_RE = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)\s*$")


_CHAIN_RE = re.compile(r"^\s*\d+\s*[-+*/]\s*\d+(\s*=\s*\d+\s*[-+*/]\s*\d+)+(\s*=\s*\d+)?\s*$")
_CHAIN_LINK_RE = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*$")


def render_chain(expression: str) -> str | None:
    """``3 * 5 + 7`` -> ``3 * 5 = 15 + 7 = 22``; None if no chain spells the expression.

    A chain carries each result into the next operation as its left operand, so ``a o (b o c)``
    is written ``b o c = w o a = v`` when ``o`` is + or * (operands swapped) and has no chain
    otherwise (``20 - 3 * 5``, ``20 / ( 5 - 1 )``).
    """
    tree = parse_tree(expression)
    if isinstance(tree, int):
        return None
    op, left, right = tree
    if not isinstance(left, int):
        first, carried_op, last = left, op, right
    elif not isinstance(right, int) and op in "+*":
        first, carried_op, last = right, op, left
    else:
        return None
    if not (isinstance(first[1], int) and isinstance(first[2], int) and isinstance(last, int)):
        return None
    mid = evaluate(first)
    return f"{first[1]} {first[0]} {first[2]} = {mid} {carried_op} {last} = {evaluate((carried_op, mid, last))}"


def chain_to_steps(line: str) -> str | None:
    """A chain line (``3 * 5 = 15 + 7 = 22``) as the steps it abbreviates
    (``3 * 5 = 15 , 15 + 7 = 22``), or None if the line is not a chain. An open last link
    (no ``= r``) gets its true result, so only the written results can be wrong claims."""
    if not _CHAIN_RE.match(line):
        return None
    parts = [p.strip() for p in line.split("=")]
    first = _CHAIN_LINK_RE.match(parts[0])
    steps, pending = [], f"{first.group(1)} {first.group(2)} {first.group(3)}"
    for part in parts[1:]:
        if part.isdigit():  # "= r" closes the chain (the pattern allows it only last)
            steps.append(f"{pending} = {part}")
            pending = None
            break
        link = _CHAIN_LINK_RE.match(part)
        steps.append(f"{pending} = {link.group(1)}")
        pending = f"{link.group(1)} {link.group(2)} {link.group(3)}"
    if pending is not None:
        a, op, b = pending.split()
        try:
            value = evaluate((op, int(a), int(b)))
        except ExpressionValueError:
            value = 0  # never trusted: read_steps recomputes this step, finds the inexact division, scores 0.1
        steps.append(f"{pending} = {value}")
    return " , ".join(steps)


def render_steps(expression: str) -> str:
    """``3 * 5 + 7`` -> ``3 * 5 = 15 , 15 + 7 = 22``: the expression's operations in evaluation order."""
    steps: list[str] = []

    def walk(node) -> int:
        if isinstance(node, int):
            return node
        op, left, right = node
        a, b = walk(left), walk(right)
        value = evaluate((op, a, b))
        steps.append(f"{a} {op} {b} = {value}")
        return value

    walk(parse_tree(expression))
    return " , ".join(steps)


@dataclass(frozen=True)
class Steps:
    """A steps line read against the given numbers (see ``read_steps``)."""

    expression: str  # the expression the steps spell out, fully parenthesised
    value: int  # the last step's true result (its stated one when the division is inexact)
    uses_numbers: bool  # every given number used exactly once, and nothing else left over
    error: str | None  # first rule broken (wrong claimed result, inexact division, unknown operand)
    false_claim: bool = False  # some step states a result its operation does not give


def read_steps(completion: str, numbers: list[int]) -> Steps | None:
    """The first non-empty line as steps ``a op b = r , ...``; None unless every comma-separated
    part has that shape (then the line is read as a plain expression instead)."""
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    if lines and (steps := chain_to_steps(lines[0])) is not None:
        lines = [steps]
    parts = lines[0].split(",") if lines else []
    matches = [_STEP_RE.match(part) for part in parts]
    if not parts or not all(matches):
        return None
    pool: list[tuple[int, str]] = [(n, str(n)) for n in numbers]  # available value, its expression
    value, error, expression, false_claim = None, None, "", False
    for m in matches:
        a, op, b, claimed = int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))
        operands = []
        for x in (a, b):
            hit = next((i for i, (v, _) in enumerate(pool) if v == x), None)
            if hit is None:
                error = error or f"{x} is not available"
                operands.append((x, str(x)))
            else:
                operands.append(pool.pop(hit))
        expression = f"( {operands[0][1]} {op} {operands[1][1]} )"
        try:
            value = evaluate((op, a, b))
        except ExpressionValueError as e:
            return Steps(expression, claimed, False, str(e))
        if value != claimed:
            error = error or f"{a} {op} {b} is {value}, not {claimed}"
            false_claim = True
        pool.append((claimed, expression))
    uses = error is None and len(pool) == 1
    return Steps(expression.removeprefix("( ").removesuffix(" )"), value, uses, error, false_claim)


def extract_expression(completion: str) -> str:
    """First non-empty line, cut at ``=`` (drops ``= target``), then its longest prefix made
    only of digits, operators, parentheses and spaces (so trailing junk words are ignored)."""
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    line = lines[0].split("=", 1)[0] if lines else ""
    return _EXPR_PREFIX_RE.match(line).group().strip()


ANSWER_MODES = ("canonical", "any", "prompt_order", "steps", "chain", "table")
TABLE_FORMAT = "dllm-countdown-answers"


@lru_cache(maxsize=8)
def load_answer_table(path: str) -> dict[str, str]:
    """Problem key (``"3 5 7=22"``) -> training answer, read from a JSON table
    (``{"format": "dllm-countdown-answers", "answers": {key: expression}}``).

    Every entry must be a training-split problem and one of its solving expressions, so a table can
    change which right answer the model is taught but never teaches a wrong one or a test problem.
    """
    import json
    from pathlib import Path

    from .base import split_of_key

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"answer_table {path!r} does not exist") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"answer_table {path!r} is not readable JSON: {e}") from None
    if not isinstance(data, dict) or data.get("format") != TABLE_FORMAT or not isinstance(data.get("answers"), dict):
        raise ValueError(f"answer_table {path!r} is not a {TABLE_FORMAT} file "
                         "(python -m dllm.training.countdown_answers writes one)")
    table: dict[str, str] = {}
    for key, expression in data["answers"].items():
        try:
            numbers_text, target_text = key.split("=")
            numbers, target = tuple(int(x) for x in numbers_text.split()), int(target_text)
        except ValueError:
            raise ValueError(f"answer_table {path!r}: bad key {key!r} (want e.g. '3 5 7=22')") from None
        if split_of_key(key) != "train":
            raise ValueError(f"answer_table {path!r}: {key!r} is a test problem; tables may only hold training ones")
        if (len(numbers) != N_NUMBERS or list(numbers) != sorted(numbers)
                or expression not in all_solutions(numbers).get(target, ())):
            raise ValueError(f"answer_table {path!r}: {expression!r} is not a solution of {key!r}")
        table[key] = expression
    return table


@lru_cache(maxsize=512)
def pair_solutions(numbers: tuple[int, int]) -> dict[int, str]:
    """target -> the first single operation over two sorted numbers that reaches it (targets >= 1)."""
    table: dict[int, str] = {}
    for a, b in dict.fromkeys(itertools.permutations(numbers)):
        for op in OPS:
            v = _apply(a, op, b)
            if v is not None and v >= MIN_TARGET:
                table.setdefault(v, f"{a} {op} {b}")
    return table


def _pair_problem(numbers: list[int], target: int, expression: str, steps: bool = False) -> Problem:
    answer = render_steps(expression) if steps else expression
    key = " ".join(map(str, sorted(numbers))) + f"={target}"
    prompt = f"numbers {' '.join(map(str, numbers))} target {target} :"
    return Problem(key, prompt, answer, {"numbers": numbers, "target": target})


def all_pair_problems() -> list[Problem]:
    """Every two-number problem the ``pairs`` training option can draw (numbers in sorted order),
    of both splits; ``split_of_key(problem.key)`` tells which."""
    return [_pair_problem([a, b], t, e)
            for a in range(MIN_NUMBER, MAX_NUMBER + 1) for b in range(a, MAX_NUMBER + 1)
            for t, e in sorted(pair_solutions((a, b)).items())]


class CountdownSuite(TaskSuite):
    """3-number Countdown with targets in [1, 100].

    ``answers="canonical"`` (default; what every evaluation uses) gives the first solution of the
    fixed enumeration as the reference answer. ``answers="any"`` (a training option,
    ``data.suite_options.countdown.answers``) draws the reference uniformly from all distinct
    solving expressions instead: the scorer accepts any of them, and the canonical one asks a
    model to know that every earlier expression of the enumeration misses the target.
    ``answers="prompt_order"`` (also for training) runs the same enumeration over the numbers in
    the order the prompt shows them, so the reference is a function of the prompt as written
    rather than of the sorted numbers. ``answers="steps"`` writes the canonical solution as steps
    (``3 * 5 = 15 , 15 + 7 = 22``), so the intermediate result is on the canvas.
    ``answers="chain"`` writes the first solution of the enumeration that a chain can spell
    (``3 * 5 = 15 + 7 = 22``: the intermediate result once, computable from either side) and
    draws only targets that have one (about 94% of problems).

    ``keep_additive`` (training option, default 1.0) keeps a drawn problem whose reference uses only
    + and - with that probability and draws again otherwise, so products and quotients make up
    more of the data; 1.0 draws exactly the default problems.

    ``pairs`` (training option, default 0.0) makes that share of the drawn problems two-number
    ones (``numbers 4 7 target 28 :`` -> ``4 * 7``; any target one operation reaches, up to 400),
    the single step every three-number answer is built on, so products and quotients are trained
    on their own; 0.0 draws exactly the default problems. Evaluation never draws pairs.

    ``answers="table"`` with ``answer_table=PATH`` (training option) teaches, for each problem the
    table lists, the solving expression it names, and the canonical one otherwise. The problems drawn
    are the default ones (same random stream); only their reference answers change.
    ``python -m dllm.training.countdown_answers`` writes such a table with the solution a given model
    finds most likely, so the taught answer is unique per problem (unlike ``any``) yet need not be the
    enumeration's first.
    """

    name = "countdown"
    max_prompt_tokens = 12  # "numbers" + 6 digits + "target" + 3 digits + ":"
    max_answer_tokens = 10  # 6 digits + 2 operators + 2 parentheses

    def __init__(self, answers: str = "canonical", keep_additive: float = 1.0,
                 answer_table: str | None = None, pairs: float = 0.0) -> None:
        if answers not in ANSWER_MODES:
            raise ValueError(f"unknown answers mode {answers!r}; valid: {', '.join(ANSWER_MODES)}")
        if (answers == "table") != (answer_table is not None):
            raise ValueError("answers='table' and answer_table=PATH go together (one names the other)")
        self.table = load_answer_table(str(answer_table)) if answer_table is not None else {}
        if isinstance(keep_additive, bool) or not isinstance(keep_additive, (int, float)) \
                or not 0.0 < keep_additive <= 1.0:
            raise ValueError(f"keep_additive must be a number in (0, 1], got {keep_additive!r}")
        if isinstance(pairs, bool) or not isinstance(pairs, (int, float)) or not 0.0 <= pairs < 1.0:
            raise ValueError(f"pairs must be a number in [0, 1), got {pairs!r}")
        if pairs and answers not in ("canonical", "steps"):
            raise ValueError(f"pairs is only for answers canonical or steps, not {answers!r}")
        self.answers, self.keep_additive, self.pairs = answers, float(keep_additive), float(pairs)
        if answers == "steps":
            # "20 * 20 = 400 , 400 - 19 = 381": 15 digits, 2 operators, 2 "=", 1 ","
            self.max_answer_tokens = 20
        elif answers == "chain":
            # "20 * 20 = 400 - 19 = 381": 12 digits, 2 operators, 2 "="
            self.max_answer_tokens = 16

    def _draw_pair(self, rng: random.Random) -> Problem:
        numbers = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(2)]
        table = pair_solutions(tuple(sorted(numbers)))
        target = rng.choice(sorted(table))
        return _pair_problem(numbers, target, table[target], self.answers == "steps")

    def _draw(self, rng: random.Random) -> Problem:
        if self.pairs and rng.random() < self.pairs:
            return self._draw_pair(rng)
        while True:
            numbers = [rng.randint(MIN_NUMBER, MAX_NUMBER) for _ in range(N_NUMBERS)]
            table = solutions(tuple(sorted(numbers)))
            targets = sorted(t for t in table if MIN_TARGET <= t <= MAX_TARGET)
            if self.answers == "chain":
                targets = [t for t in targets if _first_chain(tuple(sorted(numbers)), t) is not None]
            if not targets:
                continue
            target = rng.choice(targets)
            answer = table[target]
            if self.answers == "table":
                answer = self.table.get(" ".join(map(str, sorted(numbers))) + f"={target}", answer)
            if self.keep_additive < 1.0 and not set("*/") & set(answer) and rng.random() >= self.keep_additive:
                continue
            break
        if self.answers == "any":
            answer = rng.choice(all_solutions(tuple(sorted(numbers)))[target])
        elif self.answers == "prompt_order":
            answer = solutions(tuple(numbers))[target]
        elif self.answers == "steps":
            answer = render_steps(answer)
        elif self.answers == "chain":
            answer = _first_chain(tuple(sorted(numbers)), target)
        key = " ".join(map(str, sorted(numbers))) + f"={target}"
        prompt = f"numbers {' '.join(map(str, numbers))} target {target} :"
        return Problem(key, prompt, answer, {"numbers": numbers, "target": target})

    def score(self, example: Example, completion: str) -> Score:
        """d1-style 1.0 / 0.1 / 0.0 reward (see module docstring)."""
        numbers, target = example.meta["numbers"], example.meta["target"]
        steps = read_steps(completion, numbers)
        if steps is not None:
            ok = steps.error is None and steps.uses_numbers and steps.value == target
            details = {"expression": steps.expression, "value": steps.value, "uses_numbers": steps.uses_numbers,
                       "steps": True, "false_claim": steps.false_claim,
                       **({"error": steps.error} if steps.error else {})}
            return Score(ok, 1.0 if ok else 0.1, details)
        text = extract_expression(completion)
        try:
            parsed = parse_expression(text)  # syntax is checked in full before evaluation
        except ExpressionSyntaxError as e:
            return Score(False, 0.0, {"expression": text, "error": str(e)})
        except ExpressionValueError as e:
            return Score(False, 0.1, {"expression": text, "error": str(e)})
        uses = Counter(parsed.numbers) == Counter(numbers)
        ok = uses and parsed.value == target
        details = {"expression": text, "value": parsed.value, "uses_numbers": uses}
        return Score(ok, 1.0 if ok else 0.1, details)
