"""``sudoku``: 4x4 Sudoku (digits 1-4, 2x2 boxes) with a unique solution.

Grids are written row-major as 16 digits, rows separated by ``/``, 0 marks a blank:
prompt ``sudoku : 1 0 3 0 / 0 0 0 2 / 0 1 0 0 / 4 0 0 0``; answer ``1 2 3 4 / 3 4 1 2 / 2 1 4 3 / 4 3 2 1``.

Reward: 1.0 if solved exactly, else 0.5 * blank_accuracy (fraction of originally blank cells
filled correctly, the d1-style Sudoku reward, halved so a partial grid never ties a solved one).
"""
from __future__ import annotations

import random
import re
from functools import lru_cache

from .base import Example, Problem, Score, TaskSuite

MIN_GIVENS, MAX_GIVENS = 6, 10
_DIGIT_RE = re.compile(r"[0-9]")


def _box(cell: int) -> int:
    return (cell // 8) * 2 + (cell % 4) // 2


def _peers(cell: int) -> list[int]:
    r, c, b = cell // 4, cell % 4, _box(cell)
    return [o for o in range(16) if o != cell and (o // 4 == r or o % 4 == c or _box(o) == b)]


PEERS: tuple[tuple[int, ...], ...] = tuple(tuple(_peers(c)) for c in range(16))


def solve(grid: str, limit: int = 2) -> list[str]:
    """Backtracking solver: up to ``limit`` solutions of a 16-char puzzle ('0' = blank)."""
    cells = [int(ch) for ch in grid]
    found: list[str] = []

    def rec() -> None:
        if len(found) >= limit:
            return
        try:
            cell = cells.index(0)
        except ValueError:
            found.append("".join(map(str, cells)))
            return
        for d in range(1, 5):
            if all(cells[p] != d for p in PEERS[cell]):
                cells[cell] = d
                rec()
                cells[cell] = 0

    if all(ch == "0" or all(grid[p] != ch for p in PEERS[i]) for i, ch in enumerate(grid)):
        rec()
    return found


@lru_cache(maxsize=1)
def all_solutions() -> tuple[str, ...]:
    """All 288 valid completed 4x4 grids, in lexicographic order."""
    return tuple(solve("0" * 16, limit=10_000))


@lru_cache(maxsize=1)
def _cell_digit_masks() -> tuple[tuple[int, ...], ...]:
    """masks[cell][digit]: bitset over all_solutions() of grids holding ``digit`` at ``cell``."""
    sols = all_solutions()
    return tuple(
        tuple(sum(1 << g for g, s in enumerate(sols) if s[cell] == str(d)) for d in range(5))
        for cell in range(16)
    )


def count_completions(puzzle: str) -> int:
    """Number of valid grids consistent with ``puzzle`` (fast bitset intersection)."""
    masks, alive = _cell_digit_masks(), (1 << len(all_solutions())) - 1
    for cell, ch in enumerate(puzzle):
        if ch != "0":
            alive &= masks[cell][int(ch)]
    return bin(alive).count("1")


def format_grid(cells: str) -> str:
    """``1234341221434321`` -> ``1 2 3 4 / 3 4 1 2 / 2 1 4 3 / 4 3 2 1``"""
    return " / ".join(" ".join(cells[r * 4 : r * 4 + 4]) for r in range(4))


def parse_grid(completion: str) -> str:
    """First 16 digits of the completion (fewer if it has fewer); separators and junk ignored."""
    return "".join(_DIGIT_RE.findall(completion)[:16])


class SudokuSuite(TaskSuite):
    """Unique-solution 4x4 Sudoku with 6-10 givens."""

    name = "sudoku"
    max_prompt_tokens = 21  # "sudoku :" (2) + 16 digits + 3 slashes
    max_answer_tokens = 19  # 16 digits + 3 slashes

    def _draw(self, rng: random.Random) -> Problem:
        solution = rng.choice(all_solutions())
        givens = rng.randint(MIN_GIVENS, MAX_GIVENS)
        while True:
            shown = set(rng.sample(range(16), givens))
            puzzle = "".join(ch if i in shown else "0" for i, ch in enumerate(solution))
            if count_completions(puzzle) == 1:
                break
        meta = {"puzzle": puzzle, "solution": solution, "givens": givens}
        return Problem(puzzle, f"sudoku : {format_grid(puzzle)}", format_grid(solution), meta)

    def category(self, example: Example) -> str:
        """How many cells are blank (``8 blanks``)."""
        return f"{16 - example.meta['givens']} blanks"

    def score(self, example: Example, completion: str) -> Score:
        """Exact grid match => correct (reward 1); otherwise reward = 0.5 * blank accuracy."""
        puzzle, solution = example.meta["puzzle"], example.meta["solution"]
        got = parse_grid(completion)
        right = [i < len(got) and got[i] == solution[i] for i in range(16)]
        blanks = [i for i in range(16) if puzzle[i] == "0"]
        cell_acc = sum(right) / 16
        blank_acc = sum(right[i] for i in blanks) / len(blanks)
        ok = got == solution
        details = {"parsed": got, "cell_accuracy": cell_acc, "blank_accuracy": blank_acc}
        return Score(ok, 1.0 if ok else 0.5 * blank_acc, details)
