"""Deterministic, verifiable task suites (SFT data, evaluation, RL rewards).

>>> suite = get_suite("arith")
>>> ex = suite.examples("test", 1)[0]
>>> suite.score(ex, ex.answer).correct
True
"""
from __future__ import annotations

from .arith import ArithSuite
from .base import Example, Score, TaskSuite, count_tokens, split_of_key
from .builtin import _REGISTRY, SUITE_GROUPS, get_suite, suite_names
from .chain import ChainSuite
from .countdown import CountdownSuite
from .gsm import GsmSuite
from .jsonl import FileSuite, is_data_file, source_labels
from .lists import ListsSuite
from .longlists import LongListsSuite
from .sudoku import SudokuSuite
from .sudoku9 import Sudoku9Suite


def resolve_suites(spec: str) -> list[TaskSuite]:
    """A comma-separated list of suite names, groups (``all``: the five short-answer suites; ``long``:
    the long-answer suites; ``every``: both) and JSON Lines files (``my.jsonl``: a
    :class:`~dllm.eval.tasks.jsonl.FileSuite`, named by its stem), duplicates dropped, order kept."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError(f"empty suite spec {spec!r}; use 'all', 'long', 'every' or a comma list of: "
                         f"{', '.join(_REGISTRY)} (or JSON Lines files, my.jsonl)")
    names = list(dict.fromkeys(x for n in names for x in SUITE_GROUPS.get(n, [n])))
    for n in names:
        if not is_data_file(n) and n not in _REGISTRY and ("." in n or "/" in n):
            raise ValueError(f"unknown suite {n!r}: a file of your own examples must be JSON Lines named *.jsonl; "
                             f"valid suites: {', '.join(_REGISTRY)}")
    labels = source_labels([n for n in names if is_data_file(n)])
    return [FileSuite(n, labels[n]) if is_data_file(n) else get_suite(n) for n in names]


__all__ = [
    "ArithSuite", "ChainSuite", "CountdownSuite", "Example", "GsmSuite", "ListsSuite", "LongListsSuite", "Score",
    "Sudoku9Suite", "SudokuSuite", "TaskSuite", "count_tokens", "get_suite", "resolve_suites", "split_of_key",
    "suite_names",
]
