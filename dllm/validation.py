"""One check for every numeric option: a finite number (an integer where the option counts something)
inside its range, with a message that names the option and the range.

Comparisons alone let NaN through (``nan <= 0`` and ``nan > 1`` are both false) and accept infinity
as "large"; these checks test finiteness first, so a range written once is enough::

    >>> number_error("optim.lr", float("nan"), gt=0)
    'optim.lr=nan must be a finite number > 0'
    >>> Range(ge=0, le=1).error("threshold", 0.5) is None
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

__all__ = ["Range", "number_error", "number_problem"]


@dataclass(frozen=True)
class Range:
    """Bounds of one numeric option. ``ge``/``gt`` and ``le``/``lt``: inclusive/exclusive bounds (None:
    unbounded on that side). ``integer``: whole numbers only, an int (2.0 is refused; bool always is).
    ``optional``: None is accepted (the option's "unset"). ``off``: one value outside the range that is
    still valid, the option's "off" switch (``pad_numbers=0``, "or >= 2")."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    integer: bool = False
    optional: bool = False
    off: float | None = None

    def describe(self) -> str:
        """The range in words: ``in [0, 1]``, ``> 0``, ``>= 1``, ``in (0, 1]``, with ``0 (off) or`` before it."""
        lo = self.ge if self.ge is not None else self.gt
        hi = self.le if self.le is not None else self.lt
        if lo is not None and hi is not None:
            text = (f"in {'[' if self.ge is not None else '('}{_num(lo)}, "
                    f"{_num(hi)}{']' if self.le is not None else ')'}")
        elif lo is not None:
            text = f"{'>=' if self.ge is not None else '>'} {_num(lo)}"
        elif hi is not None:
            text = f"{'<=' if self.le is not None else '<'} {_num(hi)}"
        else:
            text = ""
        if self.off is not None:
            text = f"{_num(self.off)} (off) or {text}".rstrip()
        if self.optional:
            text = f"{text} (or null)".lstrip()
        return text

    def contains(self, value) -> bool:
        return self.error("x", value) is None

    def error(self, name: str, value) -> str | None:
        """Why ``value`` is not valid for the option ``name`` (``name=value must be ...``), or None."""
        if value is None:
            return None if self.optional else f"{name} may not be null; give a number {self.describe()}".rstrip()
        kind = "an integer" if self.integer else "a finite number"
        if isinstance(value, bool) or not isinstance(value, Real):
            return f"{name}={value!r} must be {kind} {self.describe()}".rstrip()
        if not math.isfinite(value) or (self.integer and not isinstance(value, Integral)):
            return f"{name}={value!r} must be {kind} {self.describe()}".rstrip()
        if self.off is not None and value == self.off:
            return None
        if ((self.ge is not None and not value >= self.ge) or (self.gt is not None and not value > self.gt)
                or (self.le is not None and not value <= self.le) or (self.lt is not None and not value < self.lt)):
            return f"{name}={value!r} must be {self.describe()}"
        return None


def number_error(name: str, value, *, ge=None, gt=None, le=None, lt=None, integer: bool = False,
                 optional: bool = False, off=None) -> str | None:
    """Why ``value`` is not a valid ``name`` (a finite number in range), or None: ``Range(...).error`` in one call."""
    return Range(ge=ge, gt=gt, le=le, lt=lt, integer=integer, optional=optional, off=off).error(name, value)


def number_problem(value, *, integer: bool = False, low=None, high=None, low_open: bool = False,
                   high_open: bool = False) -> str | None:
    """The same check without the name: ``"must be a finite number"``, ``"must be >= 1"``, ... or None."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return "must be a number"
    if not math.isfinite(value):
        return "must be a finite number"
    if integer and not isinstance(value, Integral):
        return "must be an integer"
    rng = Range(ge=None if low_open else low, gt=low if low_open else None,
                le=None if high_open else high, lt=high if high_open else None)
    return None if rng.error("x", value) is None else f"must be {rng.describe()}"


def _num(x) -> str:
    """A bound as a message writes it: 1, not 1.0."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))
