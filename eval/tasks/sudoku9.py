"""``sudoku9``: 9x9 Sudoku with a chosen number of blanks and a unique solution.

Grids are written row-major as 81 digits, rows separated by ``/``, 0 marks a blank (the layout of the
4x4 ``sudoku``): prompt ``sudoku : 5 3 0 0 7 0 0 0 0 / 6 0 0 ...``; answer the full grid, 81 digits and
8 slashes (89 tokens).

Difficulty knob: ``blanks`` (default 30), the number of blank cells of every puzzle. A puzzle is made
from a random solved grid (a relabelled, row/column/band/stack-permuted, possibly transposed pattern)
by blanking cells in random order: a cell whose digit its remaining peers still force (the only digit
missing from its row, column and box) is blanked without a check, any other cell only if a
backtracking count still finds exactly one solution. Every puzzle therefore has exactly one solution.

Category: how many parallel rounds of *naked singles* (fill every cell whose peers leave one digit,
all at once, repeat) solve the puzzle, the depth of the dependency chain a parallel decoder has to
follow (``3 rounds``); ``more than singles`` when naked singles get stuck. At 30 blanks every puzzle
of 200 drawn needed 2-6 rounds (docs/benchmarks.md has the distribution per blank count).

Reward: 1.0 if solved exactly, else 0.5 * blank accuracy (fraction of the blank cells filled
correctly), as in ``sudoku``. ``details`` holds ``cell_accuracy`` (all 81 cells) and ``blank_accuracy``.
"""
from __future__ import annotations

import random
import re

from .base import Example, Problem, Score, TaskSuite

SIZE = 9
CELLS = SIZE * SIZE
DEFAULT_BLANKS = 30
MIN_BLANKS, MAX_BLANKS = 1, 60  # beyond ~60 a random grid rarely still has a unique solution
_ALL_DIGITS = 0x3FE  # bits 1..9
_DIGIT_RE = re.compile(r"[0-9]")


def _units() -> list[list[int]]:
    rows = [[r * 9 + c for c in range(9)] for r in range(9)]
    cols = [[r * 9 + c for r in range(9)] for c in range(9)]
    boxes = [[(br * 3 + r) * 9 + bc * 3 + c for r in range(3) for c in range(3)] for br in range(3) for bc in range(3)]
    return rows + cols + boxes


UNITS: tuple[tuple[int, ...], ...] = tuple(tuple(u) for u in _units())
PEERS: tuple[tuple[int, ...], ...] = tuple(
    tuple(sorted({o for u in UNITS if i in u for o in u} - {i})) for i in range(CELLS)
)


def _box(cell: int) -> int:
    r, c = divmod(cell, 9)
    return (r // 3) * 3 + c // 3


def _candidates(cells: list[int], cell: int) -> int:
    """Bitset (bits 1..9) of the digits no peer of ``cell`` holds."""
    seen = 0
    for p in PEERS[cell]:
        seen |= 1 << cells[p]
    return _ALL_DIGITS & ~seen


def count_solutions(puzzle: str, limit: int = 2) -> int:
    """Number of solutions of an 81-char puzzle ('0' = blank), counting stops at ``limit``.

    Backtracking on row/column/box bitsets, always branching on the blank with fewest candidates;
    a puzzle whose givens already clash has 0.
    """
    cells = [int(ch) for ch in puzzle]
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(cells):
        if v:
            bit, r, c, b = 1 << v, i // 9, i % 9, _box(i)
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return 0
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    empties = [i for i, v in enumerate(cells) if not v]
    found = 0

    def rec(k: int) -> None:
        nonlocal found
        if k == len(empties):
            found += 1
            return
        best, best_mask, best_n = k, 0, 10
        for j in range(k, len(empties)):
            i = empties[j]
            mask = _ALL_DIGITS & ~(rows[i // 9] | cols[i % 9] | boxes[_box(i)])
            n = bin(mask).count("1")
            if n < best_n:
                best, best_mask, best_n = j, mask, n
                if n <= 1:
                    break
        if best_n == 0:
            return
        empties[k], empties[best] = empties[best], empties[k]
        i = empties[k]
        r, c, b = i // 9, i % 9, _box(i)
        mask = best_mask
        while mask and found < limit:
            bit = mask & -mask
            mask ^= bit
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            rec(k + 1)
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        empties[k], empties[best] = empties[best], empties[k]

    rec(0)
    return found


def is_valid_solution(grid: str) -> bool:
    """81 digits 1-9 with every row, column and box holding each digit once."""
    if len(grid) != CELLS or not all("1" <= ch <= "9" for ch in grid):
        return False
    return all(len({grid[i] for i in unit}) == 9 for unit in UNITS)


def random_solution(rng: random.Random) -> str:
    """A random solved grid: a fixed pattern with its digits relabelled, rows permuted within bands,
    bands permuted, columns within stacks and stacks permuted, and a transpose half of the time
    (not uniform over all Sudoku grids; the suite needs variety, not uniformity)."""
    pattern = [((r % 3) * 3 + r // 3 + c) % 9 for r in range(9) for c in range(9)]
    digits = rng.sample(range(1, 10), 9)
    bands, stacks = rng.sample(range(3), 3), rng.sample(range(3), 3)
    rows = [b * 3 + r for b in bands for r in rng.sample(range(3), 3)]
    cols = [s * 3 + c for s in stacks for c in rng.sample(range(3), 3)]
    grid = [digits[pattern[rows[r] * 9 + cols[c]]] for r in range(9) for c in range(9)]
    if rng.random() < 0.5:
        grid = [grid[c * 9 + r] for r in range(9) for c in range(9)]
    return "".join(map(str, grid))


def make_puzzle(solution: str, blanks: int, rng: random.Random) -> str | None:
    """Blank ``blanks`` cells of ``solution`` keeping the solution unique; None if a pass through the
    cells in a random order cannot (a caller then draws a new grid)."""
    cells = [int(ch) for ch in solution]
    order = list(range(CELLS))
    rng.shuffle(order)
    removed = 0
    for i in order:
        if removed == blanks:
            break
        digit, cells[i] = cells[i], 0
        # still forced by its peers: the puzzle keeps its one solution, no search needed
        if bin(_candidates(cells, i)).count("1") == 1 or count_solutions("".join(map(str, cells))) == 1:
            removed += 1
        else:
            cells[i] = digit
    return "".join(map(str, cells)) if removed == blanks else None


def naked_single_rounds(puzzle: str) -> int | None:
    """Parallel rounds of naked singles that solve ``puzzle``: each round fills, at once, every blank
    whose peers leave one digit. None if a round finds no such blank before the grid is full."""
    cells = [int(ch) for ch in puzzle]
    rounds = 0
    while 0 in cells:
        fills = {}
        for i, v in enumerate(cells):
            if not v:
                mask = _candidates(cells, i)
                if mask & (mask - 1) == 0:
                    fills[i] = mask.bit_length() - 1
        if not fills:
            return None
        for i, d in fills.items():
            cells[i] = d
        rounds += 1
    return rounds


def format_grid(cells: str) -> str:
    """81 digits -> ``d d d d d d d d d / ...`` (9 rows of 9 cells)."""
    return " / ".join(" ".join(cells[r * 9 : r * 9 + 9]) for r in range(9))


def parse_grid(completion: str) -> str:
    """First 81 digits of the completion (fewer if it has fewer); separators and junk ignored."""
    return "".join(_DIGIT_RE.findall(completion)[:CELLS])


class Sudoku9Suite(TaskSuite):
    """Unique-solution 9x9 Sudoku with ``blanks`` blank cells (default 30)."""

    name = "sudoku9"
    max_prompt_tokens = 91  # "sudoku :" (2) + 81 digits + 8 slashes
    max_answer_tokens = 89  # 81 digits + 8 slashes

    def __init__(self, blanks: int = DEFAULT_BLANKS) -> None:
        if not isinstance(blanks, int) or isinstance(blanks, bool) or not MIN_BLANKS <= blanks <= MAX_BLANKS:
            raise ValueError(f"sudoku9 blanks must be an int in [{MIN_BLANKS}, {MAX_BLANKS}], got {blanks!r}")
        self.blanks = blanks

    def _draw(self, rng: random.Random) -> Problem:
        while True:
            solution = random_solution(rng)
            puzzle = make_puzzle(solution, self.blanks, rng)
            if puzzle is not None:
                break
        rounds = naked_single_rounds(puzzle)
        meta = {"puzzle": puzzle, "solution": solution, "blanks": self.blanks, "rounds": rounds}
        return Problem(puzzle, f"sudoku : {format_grid(puzzle)}", format_grid(solution), meta)

    def category(self, example: Example) -> str:
        """Rounds of naked singles that solve the puzzle (``3 rounds``), or ``more than singles``."""
        rounds = example.meta["rounds"]
        if rounds is None:
            return "more than singles"
        return f"{rounds} round" + ("" if rounds == 1 else "s")

    def score(self, example: Example, completion: str) -> Score:
        """Exact grid match => correct (reward 1); otherwise reward = 0.5 * blank accuracy."""
        puzzle, solution = example.meta["puzzle"], example.meta["solution"]
        got = parse_grid(completion)
        right = [i < len(got) and got[i] == solution[i] for i in range(CELLS)]
        blanks = [i for i in range(CELLS) if puzzle[i] == "0"]
        cell_acc = sum(right) / CELLS
        blank_acc = sum(right[i] for i in blanks) / len(blanks)
        ok = got == solution
        details = {"parsed": got, "cell_accuracy": cell_acc, "blank_accuracy": blank_acc}
        return Score(ok, 1.0 if ok else 0.5 * blank_acc, details)
