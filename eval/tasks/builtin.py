"""The built-in task suites by name, in two groups: the short-answer suites (``all``, what the bundled
models answer) and the long-answer suites (``long``: answers of 64-256 tokens, where caches, pipelining
and lookahead decide a decoder's speed). ``every`` names both."""

from __future__ import annotations

import inspect

from .arith import ArithSuite
from .base import TaskSuite
from .chain import ChainSuite
from .countdown import CountdownSuite
from .gsm import GsmSuite
from .lists import ListsSuite
from .longlists import LongListsSuite
from .sudoku import SudokuSuite
from .sudoku9 import Sudoku9Suite

_SUITES: dict[str, type[TaskSuite]] = {
    "arith": ArithSuite,
    "gsm": GsmSuite,
    "lists": ListsSuite,
    "sudoku": SudokuSuite,
    "countdown": CountdownSuite,
}
_LONG_SUITES: dict[str, type[TaskSuite]] = {
    "sudoku9": Sudoku9Suite,
    "longlists": LongListsSuite,
    "chain": ChainSuite,
}
_REGISTRY: dict[str, type[TaskSuite]] = {**_SUITES, **_LONG_SUITES}
SUITE_GROUPS: dict[str, tuple[str, ...]] = {"all": tuple(_SUITES), "long": tuple(_LONG_SUITES),
                                            "every": tuple(_REGISTRY)}


def suite_names(group: str = "all") -> list[str]:
    """Names of a group's suites, in a fixed order: ``all`` (the default: the five short-answer
    suites), ``long`` (the long-answer suites) or ``every`` (both)."""
    try:
        return list(SUITE_GROUPS[group])
    except KeyError:
        raise ValueError(f"unknown suite group {group!r}; valid groups: {', '.join(SUITE_GROUPS)}") from None


def get_suite(name: str, **options) -> TaskSuite:
    """A fresh suite instance by name, with its constructor's ``options`` (e.g. ``ops`` for lists);
    ValueError listing the valid names (or naming the bad option) otherwise."""
    try:
        cls = _REGISTRY[name.strip()]
    except (KeyError, AttributeError):
        if isinstance(name, str) and ":" in name:  # the command line's spec, given to the Python call
            base = name.split(":", 1)[0].strip()
            raise ValueError(f"get_suite takes a suite's name and its options as keywords "
                             f"(get_suite({base!r}, max_items=16)), not a spec {name!r}; "
                             f"resolve_suites({name!r}) reads the command line's specs") from None
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(_REGISTRY)}") from None
    if options:
        takes = [k for k in inspect.signature(cls).parameters if k != "self"]
        extra = sorted(set(options) - set(takes))
        if extra:
            raise ValueError(f"suite {name!r} does not take options {extra}; it takes: {', '.join(takes) or 'none'}")
    return cls(**options)
