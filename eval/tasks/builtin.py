"""The built-in task suites by name."""

from __future__ import annotations

import inspect

from .arith import ArithSuite
from .base import TaskSuite
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
