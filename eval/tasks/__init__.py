"""Deterministic, verifiable task suites (SFT data, evaluation, RL rewards).

>>> suite = get_suite("arith")
>>> ex = suite.examples("test", 1)[0]
>>> suite.score(ex, ex.answer).correct
True
"""
from __future__ import annotations

from ..specs import parse_named_specs
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
    :class:`~dllm.eval.tasks.jsonl.FileSuite`, named by its stem), duplicates dropped, order kept.

    A built-in suite takes its constructor's options as ``name:key=value``, every following
    ``key=value`` item belonging to it (``sudoku9:blanks=40,longlists:min_items=8,max_items=16``); a
    list is written with ``+`` (``longlists:ops=sort+dedupe``). A suite appears once per spec."""
    entries = parse_named_specs(spec, "sudoku9:blanks=40 or longlists:min_items=8,max_items=16")
    if not entries:
        raise ValueError(f"empty suite spec {spec!r}; use 'all', 'long', 'every' or a comma list of: "
                         f"{', '.join(_REGISTRY)} (or JSON Lines files, my.jsonl)")
    names: list[str] = []
    options: dict[str, dict] = {}
    for name, raw in entries:
        if raw and name in SUITE_GROUPS:
            raise ValueError(f"{name!r} in {spec!r}: a group of suites takes no options; give them to one suite, "
                             "as in sudoku9:blanks=40")
        if raw and is_data_file(name):
            raise ValueError(f"{name!r} in {spec!r}: a file of examples takes no options")
        opts = {k: _option_value(v) for k, v in raw.items()}
        for n in SUITE_GROUPS.get(name, [name]):
            if n in options and options[n] != opts:
                raise ValueError(f"suite {n!r} appears twice in {spec!r} with different options; "
                                 "bench one setting per run")
            options[n] = opts
            if n not in names:
                names.append(n)
    for n in names:
        if not is_data_file(n) and n not in _REGISTRY and ("." in n or "/" in n):
            raise ValueError(f"unknown suite {n!r}: a file of your own examples must be JSON Lines named *.jsonl; "
                             f"valid suites: {', '.join(_REGISTRY)}")
    labels = source_labels([n for n in names if is_data_file(n)])
    return [FileSuite(n, labels[n]) if is_data_file(n) else get_suite(n, **options[n]) for n in names]


def _option_value(text: str):
    """A suite option from the command line: a number, true/false/none, a string, or a ``+`` list."""
    from dllm.decoding.config import parse_option_value

    value = parse_option_value(text)
    if isinstance(value, str) and "+" in value:
        return [parse_option_value(v.strip()) for v in value.split("+") if v.strip()]
    return value


__all__ = [
    "ArithSuite", "ChainSuite", "CountdownSuite", "Example", "GsmSuite", "ListsSuite", "LongListsSuite", "Score",
    "Sudoku9Suite", "SudokuSuite", "TaskSuite", "count_tokens", "get_suite", "resolve_suites", "split_of_key",
    "suite_names",
]
