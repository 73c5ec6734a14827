"""Core types of the task suites: Example, Score, the TaskSuite base class and token counting.

Every suite draws problems with a private ``random.Random(f"{name}-{split}-{seed}")``; a problem
belongs to the test split iff ``sha1(key) % TEST_MODULUS == 0`` where ``key`` is the canonical
string of the problem's defining fields, so train and test are disjoint by construction.
"""
from __future__ import annotations

import hashlib
import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

SPLITS: tuple[str, ...] = ("train", "test")
TEST_MODULUS = 10  # one problem key in ten belongs to the test split

_TOKEN_RE = re.compile(r"[A-Za-z]+|[0-9]|[^\sA-Za-z0-9]")
_INT_RE = re.compile(r"-?\d+")


def count_tokens(text: str) -> int:
    """Count tokens the way the project's word-level tokenizer splits text.

    Runs of letters are one token, every digit is one token, every other non-space
    character (punctuation, symbols) is one token; whitespace is ignored.
    """
    return len(_TOKEN_RE.findall(text))


def split_of_key(key: str) -> str:
    """Return "test" or "train" for a canonical problem key (stable hash, no global state)."""
    h = int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big")
    return "test" if h % TEST_MODULUS == 0 else "train"


def first_int(text: str) -> int | None:
    """First (optionally negative) integer in ``text``, or None."""
    m = _INT_RE.search(text)
    return int(m.group()) if m else None


def all_ints(text: str) -> list[int]:
    """All (optionally negative) integers in ``text``, in order."""
    return [int(s) for s in _INT_RE.findall(text)]


def chosen_ops(ops, valid: tuple[str, ...]) -> tuple[str, ...]:
    """A list suite's ``ops`` argument as a tuple (``None``: all of ``valid``); ValueError naming the
    valid ops if one is unknown or none is chosen. A single op may be given as a string."""
    chosen = tuple(valid if ops is None else [ops] if isinstance(ops, str) else ops)
    bad = [o for o in chosen if o not in valid]
    if bad or not chosen:
        raise ValueError(f"unknown or empty ops {bad or chosen!r}; valid ops: {', '.join(valid)}")
    return chosen


@dataclass(frozen=True)
class Example:
    """One problem: the user prompt, the exact reference completion and scorer metadata."""

    id: str
    suite: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict)  # always holds "key", the canonical problem key


@dataclass(frozen=True)
class Score:
    """Verdict on one completion: ``reward`` in [0, 1]; ``correct`` is the strict verdict."""

    correct: bool
    reward: float
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Problem:
    """What a suite's sampler returns: the canonical key plus the rendered texts."""

    key: str
    prompt: str
    answer: str
    meta: dict[str, Any]


class TaskSuite(ABC):
    """Base class: deterministic split-aware sampling; subclasses implement ``_draw`` and ``score``."""

    name: str = ""
    max_prompt_tokens: int = 0
    max_answer_tokens: int = 0

    @abstractmethod
    def _draw(self, rng: random.Random) -> Problem:
        """Draw one problem (either split); the base class filters it by the hash of its key."""

    @abstractmethod
    def score(self, example: Example, completion: str) -> Score:
        """Score a model completion (raw text) against ``example``."""

    def category(self, example: Example) -> str | None:
        """The kind of problem (``dllm bench`` reports accuracy per category); ``None``: one kind."""
        return None

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """``n`` distinct problems of ``split`` ("train"/"test"); deterministic in (split, n, seed).

        The result for a smaller ``n`` is a prefix of the result for a larger ``n``.
        """
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        rng = random.Random(f"{self.name}-{split}-{seed}")
        prefix = f"{self.name}-{split}-" + ("" if seed == 0 else f"s{seed}-")
        out: list[Example] = []
        seen: set[str] = set()
        budget = 10_000 + 50 * n  # draws; ample unless n nears the size of the problem space
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise ValueError(
                    f"suite {self.name!r} could only find {len(out)} distinct {split} problems "
                    f"(asked for {n}); its problem space is too small for that n"
                )
            p = self._draw(rng)
            if p.key in seen or split_of_key(p.key) != split:
                continue
            self._check_budget(p)
            seen.add(p.key)
            meta = {**p.meta, "key": p.key}
            out.append(Example(f"{prefix}{len(out):05d}", self.name, p.prompt, p.answer, meta))
        return out

    def _check_budget(self, p: Problem) -> None:
        if count_tokens(p.prompt) > self.max_prompt_tokens or count_tokens(p.answer) > self.max_answer_tokens:
            raise RuntimeError(f"{self.name}: problem {p.key!r} exceeds the stated token budgets (bug)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
