"""Safe arithmetic-expression parser for Countdown (no ``eval``).

Grammar (non-negative integer literals, no unary minus)::

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INT | '(' expr ')'

``parse_expression`` first builds a syntax tree (``ExpressionSyntaxError`` if malformed), then
evaluates it exactly over the integers: every division must divide exactly, otherwise
``ExpressionValueError`` (also raised for division by zero).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

_TOKEN_RE = re.compile(r"\s*(?:(\d+)|([-+*/()]))")

# literal, or (op, left, right); Union because "Node" | ... fails at runtime for a recursive alias
Node = Union[int, tuple[str, "Node", "Node"]]  # noqa: UP007


class ExpressionError(ValueError):
    """Base class: the text cannot be used as a Countdown expression."""


class ExpressionSyntaxError(ExpressionError):
    """The text is not a well-formed expression."""


class ExpressionValueError(ExpressionError):
    """Well-formed, but not exactly evaluable (inexact division or division by zero)."""


@dataclass(frozen=True)
class Parsed:
    value: int
    numbers: tuple[int, ...]  # integer literals in order of appearance


def _tokenize(text: str) -> list[str]:
    tokens, pos, text = [], 0, text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise ExpressionSyntaxError(f"unexpected character {text[pos:].lstrip()[:1]!r}")
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive-descent parser producing a ``Node`` tree."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionSyntaxError("unexpected end of expression")
        self.pos += 1
        return tok

    def expr(self) -> Node:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = (op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            node = (op, node, self.factor())
        return node

    def factor(self) -> Node:
        tok = self.take()
        if tok == "(":
            node = self.expr()
            if self.take() != ")":
                raise ExpressionSyntaxError("missing ')'")
            return node
        if tok.isdigit():
            return int(tok)
        raise ExpressionSyntaxError(f"unexpected token {tok!r}")


def parse_tree(text: str) -> Node:
    """Syntax tree of ``text``; raises ``ExpressionSyntaxError`` if malformed."""
    tokens = _tokenize(text)
    if not tokens:
        raise ExpressionSyntaxError("empty expression")
    p = _Parser(tokens)
    node = p.expr()
    if p.peek() is not None:
        raise ExpressionSyntaxError(f"unexpected token {p.peek()!r}")
    return node


def evaluate(node: Node) -> int:
    """Exact integer value of a tree; raises ``ExpressionValueError`` on inexact division."""
    if isinstance(node, int):
        return node
    op, left, right = node
    a, b = evaluate(left), evaluate(right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0 or a % b:
        raise ExpressionValueError(f"inexact division {a} / {b}")
    return a // b


def literals(node: Node) -> tuple[int, ...]:
    """Integer literals of a tree, left to right."""
    return (node,) if isinstance(node, int) else literals(node[1]) + literals(node[2])


def parse_expression(text: str) -> Parsed:
    """Parse and evaluate ``text`` exactly (see module docstring for the errors raised)."""
    node = parse_tree(text)
    return Parsed(evaluate(node), literals(node))
