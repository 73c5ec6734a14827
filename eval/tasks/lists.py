"""``lists``: ParallelBench-style "waiting line" edits on short lists of names.

Deterministic ops (exact-match scoring): copy, reverse, sort, insert, remove, replace.
Random ops (structural scoring, as ParallelBench does), which have many correct answers:
  * shuffle: same length and multiset as the input, and not identical to it;
  * replace_random: same length, the given name is present, every other position unchanged
    (i.e. exactly one position differs and it now holds the given name).
Indices are 0-based; prompts say "( counting from 0 )" wherever an index appears.
"""
from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterable

from .base import Example, Problem, Score, TaskSuite, chosen_ops
from .words import NAMES

OPS: tuple[str, ...] = ("copy", "reverse", "sort", "insert", "remove", "replace", "shuffle", "replace_random")
DETERMINISTIC_OPS: frozenset[str] = frozenset({"copy", "reverse", "sort", "insert", "remove", "replace"})
MIN_LEN, MAX_LEN = 3, 8
_NAME_SET = frozenset(NAMES)
_WORD_RE = re.compile(r"[A-Za-z]+")


def parse_names(completion: str) -> list[str]:
    """Leading run of known names on the first non-empty line; stops at the first other word."""
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    out: list[str] = []
    for word in _WORD_RE.findall(lines[0] if lines else ""):
        if word not in _NAME_SET:
            break
        out.append(word)
    return out


def apply_op(op: str, items: list[str], index: int | None = None, name: str | None = None) -> list[str]:
    """Reference result of a deterministic op."""
    if op == "copy":
        return list(items)
    if op == "reverse":
        return items[::-1]
    if op == "sort":
        return sorted(items)
    if op == "insert":
        return items[:index] + [name] + items[index:]
    if op == "remove":
        return items[:index] + items[index + 1 :]
    if op == "replace":
        return items[:index] + [name] + items[index + 1 :]
    raise ValueError(f"{op!r} is not a deterministic op; valid: {', '.join(sorted(DETERMINISTIC_OPS))}")


class ListsSuite(TaskSuite):
    """Waiting-line list ops; ``ops`` restricts the mix (default: all eight, drawn uniformly)."""

    name = "lists"
    # longest prompt: "replace index 7 with Eve ( counting from 0 ) :" (11) + 8 names = 19
    max_prompt_tokens = 19
    # longest answer: insert into an 8-name list -> 9 names
    max_answer_tokens = MAX_LEN + 1

    def __init__(self, ops: Iterable[str] | None = None) -> None:
        self.ops = chosen_ops(ops, OPS)

    def _draw(self, rng: random.Random) -> Problem:
        op = rng.choice(self.ops)
        pool = list(NAMES)
        rng.shuffle(pool)
        items, spare = pool[: rng.randint(MIN_LEN, MAX_LEN)], pool[MAX_LEN]
        meta: dict = {"op": op, "items": items}
        if op in ("copy", "reverse", "sort"):
            prompt, result = f"{op} :", apply_op(op, items)
        elif op == "insert":
            index = rng.randint(0, len(items))
            prompt, result = f"insert {spare} at index {index} ( counting from 0 ) :", apply_op(op, items, index, spare)
            meta.update(index=index, name=spare)
        elif op == "remove":
            index = rng.randrange(len(items))
            prompt, result = f"remove index {index} ( counting from 0 ) :", apply_op(op, items, index)
            meta.update(index=index)
        elif op == "replace":
            index = rng.randrange(len(items))
            prompt = f"replace index {index} with {spare} ( counting from 0 ) :"
            result = apply_op(op, items, index, spare)
            meta.update(index=index, name=spare)
        elif op == "shuffle":
            prompt, result = "shuffle :", list(items)
            while result == items:
                rng.shuffle(result)
        else:  # replace_random
            prompt, result = f"replace any one name with {spare} :", list(items)
            result[rng.randrange(len(items))] = spare
            meta.update(name=spare)
        key = "|".join([op, " ".join(items), str(meta.get("index", "")), meta.get("name", "")])
        meta["answer"] = result
        return Problem(key, f"{prompt} {' '.join(items)}", " ".join(result), meta)

    def category(self, example: Example) -> str:
        """The operation (copy, reverse, sort, insert, remove, replace, shuffle, replace_random)."""
        return example.meta["op"]

    def score(self, example: Example, completion: str) -> Score:
        """Exact match for deterministic ops; structural checks for shuffle / replace_random."""
        m = example.meta
        got, items = parse_names(completion), m["items"]
        details: dict = {"parsed": got, "op": m["op"]}
        if m["op"] in DETERMINISTIC_OPS:
            ok = got == m["answer"]
        elif m["op"] == "shuffle":
            ok = len(got) == len(items) and Counter(got) == Counter(items) and got != items
        else:  # replace_random
            diff = [i for i, (g, x) in enumerate(zip(got, items)) if g != x] if len(got) == len(items) else []
            ok = len(diff) == 1 and got[diff[0]] == m["name"]
        return Score(ok, 1.0 if ok else 0.0, details)
