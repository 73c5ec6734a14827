"""``longlists``: copy, reverse, sort and dedupe of long lists of full names (the long form of ``lists``).

An item is a full name, a first and a last name from the 16 names of ``lists`` (240 pairs, the two
never equal), items separated by `` , ``: ``Ann Bob , Kim Lee , Eve Pam``. Three tokens per item, so
a list of 22 to 48 names is an answer of 65 to 143 tokens; 22, not 16, is the shortest list because
every answer is at least 64 tokens long.

  * ``copy :`` / ``reverse :`` / ``sort :`` (alphabetical by first, then last name; every name has 3
    letters, so this is also plain string order) on 22-48 distinct names;
  * ``remove any name already at a left index :`` (dedupe): 22-40 distinct names plus 4-8 repeats
    of earlier names (26-48 items); the answer keeps each name's first occurrence, in order.

Difficulty knob: ``min_items`` / ``max_items`` (default 22 / 48, at most 48; ``min_items`` defaults
to half of a ``max_items`` below 44), the length of a copy, reverse or sort list. A dedupe list has
``min_items`` to ``max_items - max_items // 6`` distinct names plus ``ceil(min_items / 6)`` to
``max_items // 6`` repeats (at least one). Shorter lists are not long answers; they are for curricula
(``data.suite_options: {longlists: {max_items: 12}}`` in a recipe) and for measuring how accuracy
falls with length (``dllm bench --suite longlists:max_items=12``). The defaults draw exactly the
problems the suite always drew.

Prompts use only words that the short suites already use, so the suites' tokenizer covers them.

Reward: 1.0 for the exact list, else 0.5 * (positions holding the right name) / max(reference
length, parsed length), so a list that is right up to one slip earns more than a wrong one but never
ties a right one.
"""
from __future__ import annotations

import random
import re

from .base import Example, Problem, Score, TaskSuite, chosen_ops
from .words import NAMES

OPS: tuple[str, ...] = ("copy", "reverse", "sort", "dedupe")
PROMPTS: dict[str, str] = {
    "copy": "copy :",
    "reverse": "reverse :",
    "sort": "sort :",
    "dedupe": "remove any name already at a left index :",
}
MIN_LEN, MAX_LEN = 22, 48  # items in a copy / reverse / sort list, by default; MAX_LEN is also the cap
FULL_NAMES: tuple[str, ...] = tuple(f"{a} {b}" for a in NAMES for b in NAMES if a != b)
_NAME_SET = frozenset(NAMES)
_PIECE_RE = re.compile(r"[A-Za-z]+|\S")


def parse_full_names(completion: str) -> list[str]:
    """The leading run of ``First Last`` items separated by commas on the first non-empty line;
    stops at the first piece that breaks the pattern (an unknown word, a third name, a stray mark)."""
    lines = [ln for ln in completion.strip().splitlines() if ln.strip()]
    out: list[str] = []
    pending: list[str] = []
    for piece in _PIECE_RE.findall(lines[0] if lines else ""):
        if piece in _NAME_SET and len(pending) < 2:
            pending.append(piece)
            if len(pending) == 2:
                out.append(" ".join(pending))
        elif piece == "," and len(pending) == 2:
            pending = []
        else:
            break
    return out


def apply_op(op: str, items: list[str]) -> list[str]:
    """Reference result of ``op`` on ``items``."""
    if op == "copy":
        return list(items)
    if op == "reverse":
        return items[::-1]
    if op == "sort":
        return sorted(items, key=lambda s: tuple(s.split()))
    if op == "dedupe":
        return list(dict.fromkeys(items))
    raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(OPS)}")


def format_items(items: list[str]) -> str:
    return " , ".join(items)


class LongListsSuite(TaskSuite):
    """Copy / reverse / sort / dedupe of ``min_items``-``max_items`` full names (default 22-48), ops drawn
    uniformly from ``ops`` (default: all four)."""

    name = "longlists"
    # longest prompt: the dedupe words (9 tokens with ":") + 48 items (3 * 48 - 1)
    max_prompt_tokens = 9 + 3 * MAX_LEN - 1
    max_answer_tokens = 3 * MAX_LEN - 1

    def __init__(self, ops=None, min_items: int | None = None, max_items: int = MAX_LEN) -> None:
        self.ops = chosen_ops(ops, OPS)
        if min_items is None:  # 22, or half of a shorter max_items
            min_items = min(MIN_LEN, max(1, max_items // 2)) if isinstance(max_items, int) else MIN_LEN
        for key, val in (("min_items", min_items), ("max_items", max_items)):
            if not isinstance(val, int) or isinstance(val, bool) or not 1 <= val <= MAX_LEN:
                raise ValueError(f"longlists {key} must be a whole number from 1 to {MAX_LEN}; got {val!r}")
        if min_items > max_items:
            raise ValueError(f"longlists min_items ({min_items}) is above max_items ({max_items})")
        # dedupe: the repeats come on top of the distinct names, so the list stays within max_items
        self.repeats = (max(1, -(-min_items // 6)), max(1, max_items // 6))
        self.distinct = (min_items, max_items - self.repeats[1])
        if "dedupe" in self.ops and self.distinct[1] < min_items:
            raise ValueError(f"longlists dedupe lists need room for up to {self.repeats[1]} repeated names: "
                             f"max_items must be at least {min_items + self.repeats[1]} with min_items {min_items}")
        self.items = (min_items, max_items)
        self.max_answer_tokens = 3 * max_items - 1
        self.max_prompt_tokens = 9 + 3 * max_items - 1

    def _draw(self, rng: random.Random) -> Problem:
        op = rng.choice(self.ops)
        if op == "dedupe":
            items = rng.sample(FULL_NAMES, rng.randint(*self.distinct))
            for _ in range(rng.randint(*self.repeats)):
                name = rng.choice(items)
                first = items.index(name)
                items.insert(rng.randint(first + 1, len(items)), name)  # after its first occurrence
        else:
            items = rng.sample(FULL_NAMES, rng.randint(*self.items))
        result = apply_op(op, items)
        meta = {"op": op, "items": items, "answer": result}
        return Problem(f"{op}|{format_items(items)}", f"{PROMPTS[op]} {format_items(items)}",
                       format_items(result), meta)

    def category(self, example: Example) -> str:
        """The operation (copy, reverse, sort, dedupe)."""
        return example.meta["op"]

    def score(self, example: Example, completion: str) -> Score:
        """Exact list => correct (reward 1); otherwise 0.5 * positional accuracy."""
        want = example.meta["answer"]
        got = parse_full_names(completion)
        right = sum(g == w for g, w in zip(got, want))
        position_acc = right / max(len(want), len(got))
        ok = got == want
        details = {"parsed": len(got), "expected": len(want), "position_accuracy": position_acc}
        return Score(ok, 1.0 if ok else 0.5 * position_acc, details)
