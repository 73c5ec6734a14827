"""Deterministic, verifiable task suites (SFT data, evaluation, RL rewards).

>>> suite = get_suite("arith")
>>> ex = suite.examples("test", 1)[0]
>>> suite.score(ex, ex.answer).correct
True
"""
from __future__ import annotations

import inspect

from .arith import ArithSuite
from .base import Example, Score, TaskSuite, count_tokens, split_of_key
from .countdown import CountdownSuite
from .gsm import GsmSuite
from .lists import ListsSuite
from .sudoku import SudokuSuite

_SUITES: dict[str, type[TaskSuite]] = {
    "arith": ArithSuite,
    "gsm": GsmSuite,
    "lists": ListsSuite,
    "sudoku": SudokuSuite,
    "countdown": CountdownSuite,
}


def suite_names() -> list[str]:
    """Names of all registered suites, in a fixed order."""
    return list(_SUITES)


def get_suite(name: str, **options) -> TaskSuite:
    """A fresh suite instance by name, with its constructor's ``options`` (e.g. ``ops`` for lists);
    ValueError listing the valid names (or naming the bad option) otherwise."""
    try:
        cls = _SUITES[name.strip()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(_SUITES)}") from None
    if options:
        takes = [k for k in inspect.signature(cls).parameters if k != "self"]
        extra = sorted(set(options) - set(takes))
        if extra:
            raise ValueError(f"suite {name!r} does not take options {extra}; it takes: {', '.join(takes) or 'none'}")
    return cls(**options)


def resolve_suites(spec: str) -> list[TaskSuite]:
    """A comma-separated list of suite names, ``all`` (every registered suite) and JSON Lines files
    (``my.jsonl``: a :class:`~eval.tasks.jsonl.FileSuite`, named by its stem), duplicates dropped, order kept."""
    from .jsonl import FileSuite, is_data_file, source_labels

    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError(f"empty suite spec {spec!r}; use 'all' or a comma list of: {', '.join(_SUITES)} "
                         "(or JSON Lines files, my.jsonl)")
    names = list(dict.fromkeys(x for n in names for x in (_SUITES if n == "all" else [n])))
    for n in names:
        if not is_data_file(n) and n not in _SUITES and ("." in n or "/" in n):
            raise ValueError(f"unknown suite {n!r}: a file of your own examples must be JSON Lines named *.jsonl; "
                             f"valid suites: {', '.join(_SUITES)}")
    labels = source_labels([n for n in names if is_data_file(n)])
    return [FileSuite(n, labels[n]) if is_data_file(n) else get_suite(n) for n in names]


__all__ = [
    "ArithSuite", "CountdownSuite", "Example", "GsmSuite", "ListsSuite", "Score", "SudokuSuite",
    "TaskSuite", "count_tokens", "get_suite", "resolve_suites", "split_of_key", "suite_names",
]
