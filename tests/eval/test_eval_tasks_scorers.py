"""Per-suite scorer behaviour: perturbed answers, structural scoring, Sudoku, Countdown parser."""
import itertools
import random

import pytest

from dllm.eval.tasks import Example, get_suite
from dllm.eval.tasks.countdown import extract_expression, solutions
from dllm.eval.tasks.expression import (
    ExpressionSyntaxError,
    ExpressionValueError,
    parse_expression,
)
from dllm.eval.tasks.lists import ListsSuite
from dllm.eval.tasks.sudoku import all_solutions, count_completions, format_grid, solve
from dllm.eval.tasks.words import NAMES


def _ex(name, split="test", n=250):
    return get_suite(name).examples(split, n)


# ---------------------------------------------------------------- arith
def test_arith_mix_and_scoring():
    suite, exs = get_suite("arith"), _ex("arith", "train", 1000)
    ops = {e.meta["op"] for e in exs}
    assert ops == {"+", "-", "*"}
    assert all(e.meta["answer"] >= 0 and int(e.answer) == e.meta["answer"] for e in exs)
    for e in exs[:250]:
        gold = e.meta["answer"]
        assert not suite.score(e, str(gold + 1)).correct
        assert not suite.score(e, "").correct
        assert suite.score(e, f"The answer is {gold} , not {gold + 1}").correct  # first integer
        assert not suite.score(e, f"{gold + 1} or {gold}").correct
    e = Example("x", "arith", "What is 3 - 8 ?", "-5", {"op": "-", "a": 3, "b": 8, "answer": -5})
    assert suite.score(e, "-5").correct and not suite.score(e, "5").correct


# ---------------------------------------------------------------- gsm
def test_gsm_templates_and_scoring():
    suite, exs = get_suite("gsm"), _ex("gsm", "train", 2000)
    assert len({e.meta["template"] for e in exs}) >= 6
    assert {e.meta["n_steps"] for e in exs} == {2, 3}
    assert {op for e in exs for op in "+-*" if f" {op} " in e.answer} == {"+", "-", "*"}
    for e in exs:
        # every intermediate result is in [0, 999]; the worked steps are arithmetically right
        for step in e.answer.split(" #### ")[0].split(" . "):
            lhs, rhs = step.rstrip(" .").split(" = ")
            a, op, b = lhs.split()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] == int(rhs)
            assert 0 <= int(rhs) <= 999
        assert e.answer.endswith(f"#### {e.meta['answer']}")
    for e in exs[:250]:
        gold = e.meta["answer"]
        assert not suite.score(e, e.answer.replace(f"#### {gold}", f"#### {gold + 1}")).correct
        assert suite.score(e, f"#### {gold + 3} ... #### {gold}").correct  # last ####
        assert suite.score(e, f"so the total is {gold}").correct  # fallback: last integer
        assert not suite.score(e, "no number here").correct


def test_gsm_partial_credit_counts_grounded_right_steps():
    suite = get_suite("gsm")
    for e in _ex("gsm", "test", 200):
        n = e.meta["n_steps"]
        assert suite.score(e, e.answer).reward == 1.0
        assert suite.score(e, e.answer).details["correct_steps"] == n
        steps = e.answer.split(" #### ")[0].split(" . ")
        # one slip in the last step: every earlier step still earns credit, the answer none
        lhs, rhs = steps[-1].rstrip(" .").split(" = ")
        slipped = " . ".join(steps[:-1] + [f"{lhs} = {int(rhs) + 1} ."]) + f" #### {int(rhs) + 1}"
        sc = suite.score(e, slipped)
        assert not sc.correct and sc.reward == 0.5 * (n - 1) / n
        # stopping after the first step earns no more than the chain with a slip
        first = steps[0].rstrip(" .")
        assert suite.score(e, f"{first} . #### -1").reward == 0.5 / n <= sc.reward
        # equations not built from the question's numbers earn nothing, even when right
        assert suite.score(e, "1000 + 1000 = 2000 . 2000 + 1000 = 3000 . #### 3000").reward == 0.0
        # a right step written again counts once
        assert suite.score(e, " ".join([steps[0]] * 5) + " #### -1").reward == 0.5 / n
        assert suite.score(e, "no number here").reward == 0.0


# ---------------------------------------------------------------- lists
def test_lists_deterministic_ops_exact():
    suite = ListsSuite(ops=["copy", "reverse", "sort", "insert", "remove", "replace"])
    exs = suite.examples("test", 300)
    assert {e.meta["op"] for e in exs} == {"copy", "reverse", "sort", "insert", "remove", "replace"}
    assert all(3 <= len(e.meta["items"]) <= 8 for e in exs)
    for e in exs:
        got = e.answer.split()
        swapped = [got[1], got[0], *got[2:]]
        assert not suite.score(e, " ".join(swapped)).correct
        assert not suite.score(e, " ".join(got[:-1])).correct
        assert not suite.score(e, " ".join(got + [got[0]])).correct
    e = next(e for e in exs if e.meta["op"] == "insert")
    i, items = e.meta["index"], e.meta["items"]
    assert e.answer.split() == items[:i] + [e.meta["name"]] + items[i:]
    assert "( counting from 0 )" in e.prompt


def test_lists_shuffle_structural():
    suite = ListsSuite(ops=["shuffle"])
    for e in suite.examples("test", 200):
        items = e.meta["items"]
        assert e.answer.split() != items and sorted(e.answer.split()) == sorted(items)
        perms = [list(p) for p in itertools.islice(itertools.permutations(items), 24)]
        for p in perms:
            assert suite.score(e, " ".join(p)).correct == (p != items)
        assert not suite.score(e, " ".join([items[0]] + items[:-1])).correct  # duplicate name
        assert not suite.score(e, " ".join(items[::-1][:-1])).correct  # too short


def test_lists_replace_random_structural():
    suite = ListsSuite(ops=["replace_random"])
    for e in suite.examples("test", 200):
        items, name = e.meta["items"], e.meta["name"]
        assert name not in items
        for i in range(len(items)):
            assert suite.score(e, " ".join(items[:i] + [name] + items[i + 1 :])).correct
        assert not suite.score(e, " ".join(items)).correct  # unchanged
        two = [name, name] + items[2:]
        assert not suite.score(e, " ".join(two)).correct  # two positions changed
        other = next(n for n in NAMES if n not in items + [name])
        assert not suite.score(e, " ".join([other] + items[1:])).correct  # wrong name
        assert not suite.score(e, " ".join(items[:1] + [name] + items[1:])).correct  # inserted


def test_lists_parsing_is_robust():
    suite = get_suite("lists")
    e = next(e for e in suite.examples("test", 50) if e.meta["op"] == "reverse")
    assert suite.score(e, f"\n  {e.answer} </s> <pad> <pad>").correct
    assert suite.score(e, f"{e.answer} .\nAnn Bob").correct


# ---------------------------------------------------------------- sudoku
def test_sudoku_grids_valid_and_unique():
    sols = all_solutions()
    assert len(sols) == 288 and len(set(sols)) == 288
    for s in sols[:50]:
        rows = [s[r * 4 : r * 4 + 4] for r in range(4)]
        cols = ["".join(s[r * 4 + c] for r in range(4)) for c in range(4)]
        boxes = ["".join(s[r * 4 + c] for r in (br, br + 1) for c in (bc, bc + 1)) for br in (0, 2) for bc in (0, 2)]
        assert all(sorted(g) == list("1234") for g in rows + cols + boxes)
    for e in _ex("sudoku", "test", 250):
        puzzle, sol = e.meta["puzzle"], e.meta["solution"]
        assert 6 <= 16 - puzzle.count("0") <= 10
        assert solve(puzzle, limit=5) == [sol]  # backtracking solver agrees: exactly one solution
        assert count_completions(puzzle) == 1
        assert e.prompt == f"sudoku : {format_grid(puzzle)}" and e.answer == format_grid(sol)


def test_sudoku_scoring():
    suite = get_suite("sudoku")
    for e in _ex("sudoku", "test", 250):
        puzzle, sol = e.meta["puzzle"], e.meta["solution"]
        blanks = [i for i in range(16) if puzzle[i] == "0"]
        i = blanks[0]
        wrong = sol[:i] + str(int(sol[i]) % 4 + 1) + sol[i + 1 :]  # one blank cell changed
        s = suite.score(e, format_grid(wrong))
        assert not s.correct
        assert s.details["cell_accuracy"] == 15 / 16
        assert s.details["blank_accuracy"] == pytest.approx((len(blanks) - 1) / len(blanks))
        assert s.reward == pytest.approx(0.5 * (len(blanks) - 1) / len(blanks))
        s = suite.score(e, format_grid(puzzle))  # copying the puzzle gets no blank right
        assert not s.correct and s.reward == 0.0 and s.details["cell_accuracy"] == (16 - len(blanks)) / 16
        assert suite.score(e, "").reward == 0.0
        assert suite.score(e, sol).correct  # compact form is accepted too
        assert suite.score(e, format_grid(sol) + " </s> 3 3 3").correct  # trailing junk


# ---------------------------------------------------------------- countdown
@pytest.mark.parametrize(
    "text,value,numbers",
    [
        ("2 + 3 * 4", 14, (2, 3, 4)),
        ("( 2 + 3 ) * 4", 20, (2, 3, 4)),
        ("2 * ( 3 + 4 )", 14, (2, 3, 4)),
        ("10 - 4 - 3", 3, (10, 4, 3)),  # left associative
        ("10 - ( 4 - 3 )", 9, (10, 4, 3)),
        ("12 / 4 / 3", 1, (12, 4, 3)),
        ("2 * 12 / 8", 3, (2, 12, 8)),  # (2*12)/8 is exact although 12/8 is not
        ("((7))", 7, (7,)),
        ("3-8", -5, (3, 8)),
        ("  20*19-18 ", 362, (20, 19, 18)),
    ],
)
def test_expression_parser_values(text, value, numbers):
    p = parse_expression(text)
    assert (p.value, p.numbers) == (value, numbers)


@pytest.mark.parametrize(
    "text", ["", "2 +", "+ 2", "2 + * 3", "( 2 + 3", "2 + 3 )", "2 3", "-2 + 3", "2 ** 3", "abc",
             "__import__('os').system('true')", "2 + x", "2.5 * 2", "2 ^ 3", "()"],
)
def test_expression_parser_rejects_garbage(text):
    with pytest.raises(ExpressionSyntaxError):
        parse_expression(text)


@pytest.mark.parametrize("text", ["8 / 3", "7 / 0", "5 / ( 3 - 3 )", "1 / 2 * 4"])
def test_expression_parser_inexact_division(text):
    with pytest.raises(ExpressionValueError):
        parse_expression(text)


def test_countdown_generated_answers():
    suite = get_suite("countdown")
    for e in _ex("countdown", "train", 500):
        nums, target = e.meta["numbers"], e.meta["target"]
        assert len(nums) == 3 and all(1 <= n <= 20 for n in nums) and 1 <= target <= 100
        p = parse_expression(e.answer)
        assert p.value == target and sorted(p.numbers) == sorted(nums)
        assert e.prompt == f"numbers {nums[0]} {nums[1]} {nums[2]} target {target} :"
        assert solutions(tuple(sorted(nums)))[target] == e.answer  # canonical: depends on the key only
        assert suite.score(e, f"( {e.answer} )").correct  # a different correct form
        assert suite.score(e, f"{e.answer} = {target}").correct


def test_countdown_any_answers_draws_among_all_solutions():
    from dllm.eval.tasks.countdown import all_solutions

    canonical, anyans = get_suite("countdown"), get_suite("countdown", answers="any")
    exs = anyans.examples("train", 400)
    non_canonical = 0
    for e in exs:
        nums, target = e.meta["numbers"], e.meta["target"]
        sols = all_solutions(tuple(sorted(nums)))[target]
        assert sols[0] == solutions(tuple(sorted(nums)))[target] and len(set(sols)) == len(sols)
        assert e.answer in sols and canonical.score(e, e.answer).correct
        non_canonical += e.answer != sols[0]
    assert non_canonical > 100  # most problems have several solving expressions
    assert [e.answer for e in exs[:20]] == [e.answer for e in anyans.examples("train", 20)]  # deterministic
    with pytest.raises(ValueError, match="valid: canonical, any, prompt_order, steps, chain"):
        get_suite("countdown", answers="random")


def test_countdown_prompt_order_answers_follow_the_prompt():
    canonical, ordered = get_suite("countdown"), get_suite("countdown", answers="prompt_order")
    exs = ordered.examples("train", 300)
    # the same draws as the canonical suite (no extra randomness), only the reference differs
    assert [e.meta["key"] for e in exs] == [e.meta["key"] for e in canonical.examples("train", 300)]
    for e in exs:
        nums = e.meta["numbers"]
        assert e.answer == solutions(tuple(nums))[e.meta["target"]] and canonical.score(e, e.answer).correct
    assert sum(e.answer != solutions(tuple(sorted(e.meta["numbers"])))[e.meta["target"]] for e in exs) > 50


def test_countdown_rewards():
    suite = get_suite("countdown")
    e = Example("x", "countdown", "numbers 3 5 7 target 22 :", "3 * 5 + 7", {"numbers": [3, 5, 7], "target": 22})
    cases = {
        "3 * 5 + 7": 1.0,
        "7 + 5 * 3": 1.0,
        "5 * 3 + 7\n\n junk": 1.0,
        "3 * 5 + 7 </s>": 1.0,
        "3 * 5 + 7 = 22": 1.0,
        "3 * 5 + 5": 0.1,  # reused 5, 7 unused
        "3 * 5 + 7 + 0": 0.1,  # extra number
        "15 + 7": 0.1,  # right value, wrong numbers
        "3 + 5 + 7": 0.1,  # wrong value
        "7 / 5 * 3 + 1": 0.1,  # inexact division
        "3 * * 5 + 7": 0.0,
        "": 0.0,
        "the answer is 22": 0.0,
    }
    for text, reward in cases.items():
        s = suite.score(e, text)
        assert s.reward == reward, (text, s)
        assert s.correct == (reward == 1.0)
    assert extract_expression("  3 * 5 + 7 = 22\nmore") == "3 * 5 + 7"


def test_countdown_steps_answers_are_scored_like_their_expression():
    suite = get_suite("countdown")
    e = Example("x", "countdown", "numbers 3 5 7 target 22 :", "3 * 5 + 7", {"numbers": [3, 5, 7], "target": 22})
    cases = {
        "3 * 5 = 15 , 15 + 7 = 22": 1.0,
        "5 * 3 = 15 , 7 + 15 = 22\n junk": 1.0,
        "3 * 5 = 15 , 15 + 7 = 23": 0.1,  # last claim wrong
        "3 * 5 = 16 , 16 + 6 = 22": 0.1,  # first claim wrong (then 6 is not given either)
        "3 * 5 = 15 , 15 + 5 = 20": 0.1,  # 5 used twice
        "3 * 5 = 15 , 3 + 7 = 10": 0.1,  # 3 used twice, 15 left over
        "3 * 5 = 15": 0.1,  # 7 unused
        "3 * 5 = 15 , 15 + 7 = 22 , 22 - 0 = 22": 0.1,  # 0 is not available
        "7 / 3 = 2 , 2 + 5 = 7": 0.1,  # inexact division
        "3 * 5 + 7 = 22 , junk": 1.0,  # not a steps line: read as an expression, as before
    }
    for text, reward in cases.items():
        s = suite.score(e, text)
        assert s.reward == reward, (text, s)
        assert s.correct == (reward == 1.0)
    assert suite.score(e, "3 * 5 = 15 , 15 + 7 = 22").details["expression"] == "( 3 * 5 ) + 7"
    assert "not 23" in suite.score(e, "3 * 5 = 15 , 15 + 7 = 23").details["error"]


def test_countdown_steps_training_answers():
    from dllm.eval.tasks.countdown import render_steps

    assert render_steps("3 * 5 + 7") == "3 * 5 = 15 , 15 + 7 = 22"
    assert render_steps("3 * ( 7 - 5 )") == "7 - 5 = 2 , 3 * 2 = 6"  # operand order kept
    assert render_steps("20 / ( 5 - 1 )") == "5 - 1 = 4 , 20 / 4 = 5"
    canonical, steps = get_suite("countdown"), get_suite("countdown", answers="steps")
    exs = steps.examples("train", 300)  # also checks the raised answer budget (20 tokens)
    assert [e.meta["key"] for e in exs] == [e.meta["key"] for e in canonical.examples("train", 300)]
    for e in exs:
        assert e.answer == render_steps(solutions(tuple(sorted(e.meta["numbers"])))[e.meta["target"]])
        assert canonical.score(e, e.answer).correct


def test_countdown_chain_answers_are_scored_like_their_steps():
    from dllm.eval.tasks.countdown import chain_to_steps

    suite = get_suite("countdown")
    e = Example("x", "countdown", "numbers 3 5 7 target 22 :", "3 * 5 + 7", {"numbers": [3, 5, 7], "target": 22})
    cases = {
        "3 * 5 = 15 + 7 = 22": 1.0,
        "3*5=15+7": 1.0,  # open last link: its result is computed, nothing claimed
        "7 + 15 = 22": 0.1,  # one step: 15 is not a given number
        "3 * 5 = 15 + 7 = 23": 0.1,  # last claim wrong
        "3 * 5 = 16 + 6 = 22": 0.1,  # first claim wrong
        "3 * 5 = 15 + 5 = 20": 0.1,  # 5 used twice
        "5 - 3 = 2 + 7": 0.1,  # valid chain, wrong value (9)
        "7 / 3 = 2 + 5 = 7": 0.1,  # inexact division
        "3 * 5 = 15 + 7 = 22 = 22": 0.1,  # not a chain (a bare "= r" only last): the expression "3 * 5"
    }
    for text, reward in cases.items():
        s = suite.score(e, text)
        assert s.reward == reward, (text, s)
        assert s.correct == (reward == 1.0)
    assert chain_to_steps("3 * 5 = 15 + 7 = 22") == "3 * 5 = 15 , 15 + 7 = 22"
    assert chain_to_steps("3 * 5 + 7 = 22") is None and chain_to_steps("3 * 5 = 15") is None
    assert suite.score(e, "3 * 5 = 15 + 7 = 22").details["expression"] == "( 3 * 5 ) + 7"
    assert suite.score(e, "3 * 5 = 16 + 6 = 22").details["false_claim"]
    assert "not available" in suite.score(e, "3 * 5 = 15 + 5 = 20").details["error"]


def test_countdown_chain_training_answers():
    from dllm.eval.tasks.countdown import all_solutions, render_chain

    assert render_chain("3 * 5 + 7") == "3 * 5 = 15 + 7 = 22"
    assert render_chain("3 * ( 7 - 5 )") == "7 - 5 = 2 * 3 = 6"  # commutative outer op: operands swapped
    assert render_chain("20 - ( 5 + 1 )") is None  # a chain carries its result on the left only
    assert render_chain("20 / ( 5 - 1 )") is None
    canonical, chain = get_suite("countdown"), get_suite("countdown", answers="chain")
    exs = chain.examples("train", 300)  # also checks the raised answer budget (16 tokens)
    for e in exs:
        nums, target = tuple(sorted(e.meta["numbers"])), e.meta["target"]
        chains = [c for x in all_solutions(nums)[target] if (c := render_chain(x))]
        assert e.answer == chains[0]  # the first chainable solution of the enumeration
        assert canonical.score(e, e.answer).correct
    # targets reachable only by unchainable expressions are not drawn; evaluation is unchanged
    test = canonical.examples("test", 600)
    unchainable = [e for e in test if not any(render_chain(x) for x in
                                              all_solutions(tuple(sorted(e.meta["numbers"])))[e.meta["target"]])]
    assert 0 < len(unchainable) < 60


def test_countdown_keep_additive_shifts_the_mix_to_products_and_quotients():
    canonical = get_suite("countdown")
    additive = lambda exs: sum(not set("*/") & set(e.answer) for e in exs) / len(exs)  # noqa: E731
    base = canonical.examples("train", 1000)
    assert [e.answer for e in get_suite("countdown", keep_additive=1.0).examples("train", 1000)] == \
        [e.answer for e in base]  # 1.0 draws exactly the default problems
    fewer = get_suite("countdown", keep_additive=0.3).examples("train", 1000)
    assert additive(base) > 0.3 and additive(fewer) < 0.6 * additive(base)
    assert all(canonical.score(e, e.answer).correct for e in fewer)
    for bad in (0, 1.5, "half", True):
        with pytest.raises(ValueError, match="keep_additive must be a number in"):
            get_suite("countdown", keep_additive=bad)


@pytest.mark.parametrize("numbers", [(2, 3, 4), (1, 1, 20), (6, 6, 6), (5, 7, 19)])
def test_countdown_solver_finds_every_target(numbers):
    """Independent brute force: every value of a 3-number expression tree whose steps are
    non-negative integers (exact division) is in the table, and nothing else is."""

    def step(a, op, b):
        if op == "/":
            return a // b if b and a % b == 0 else None
        v = {"+": a + b, "-": a - b, "*": a * b}[op]
        return v if v >= 0 else None

    expected = set()
    for a, b, c in itertools.permutations(numbers):
        for o1, o2 in itertools.product("+-*/", repeat=2):
            left, right = step(a, o1, b), step(b, o2, c)
            candidates = (None if left is None else step(left, o2, c), None if right is None else step(a, o1, right))
            expected |= {v for v in candidates if v is not None}
    table = solutions(numbers)
    assert set(table) == expected
    for v, text in table.items():
        p = parse_expression(text)
        assert p.value == v and sorted(p.numbers) == sorted(numbers)


def test_countdown_robust_to_random_junk():
    suite = get_suite("countdown")
    rng = random.Random(0)
    e = _ex("countdown", "test", 1)[0]
    for _ in range(200):
        junk = "".join(rng.choice("0123456789+-*/() xyz=\n") for _ in range(rng.randint(0, 20)))
        s = suite.score(e, junk)
        assert s.reward in (0.0, 0.1, 1.0) and 0.0 <= s.reward <= 1.0


def _table_file(tmp_path, answers, fmt="dllm-countdown-answers"):
    import json

    path = tmp_path / "table.json"
    path.write_text(json.dumps({"format": fmt, "answers": answers}))
    return str(path)


def test_countdown_answer_table_changes_only_the_taught_answers(tmp_path):
    from dllm.eval.tasks.base import split_of_key
    from dllm.eval.tasks.countdown import all_solutions

    base = get_suite("countdown").examples("train", 400)
    # the last solving expression of every problem in the first 200 that has several
    table = {}
    for e in base[:200]:
        nums = tuple(sorted(e.meta["numbers"]))
        sols = all_solutions(nums)[e.meta["target"]]
        if len(sols) > 1:
            table[" ".join(map(str, nums)) + f"={e.meta['target']}"] = sols[-1]
    assert len(table) > 50 and all(split_of_key(k) == "train" for k in table)
    tabled = get_suite("countdown", answers="table", answer_table=_table_file(tmp_path, table))
    drawn = tabled.examples("train", 400)
    assert [(e.id, e.prompt) for e in drawn] == [(e.id, e.prompt) for e in base]  # same problems
    changed = 0
    for old, new in zip(base, drawn):
        assert new.answer == table.get(new.meta["key"], old.answer)
        assert tabled.score(new, new.answer).correct
        changed += new.answer != old.answer
    assert changed == len(table)


def test_countdown_answer_table_rejects_bad_tables(tmp_path):
    from dllm.eval.tasks.base import split_of_key

    test_key = get_suite("countdown").examples("test", 1)[0].meta["key"]
    train = get_suite("countdown").examples("train", 1)[0]
    train_key = train.meta["key"]
    assert split_of_key(test_key) == "test" and split_of_key(train_key) == "train"
    cases = {
        "is a test problem": {test_key: "1 + 1 + 1"},
        "is not a solution": {train_key: "1 + 2 + 3" if train.answer != "1 + 2 + 3" else "1 + 2 + 4"},
        "bad key": {"three=4": "1 + 1 + 2"},
    }
    for i, (message, answers) in enumerate(cases.items()):
        sub = tmp_path / str(i)
        sub.mkdir()
        with pytest.raises(ValueError, match=message):
            get_suite("countdown", answers="table", answer_table=_table_file(sub, answers))
    with pytest.raises(ValueError, match="is not a dllm-countdown-answers file"):
        get_suite("countdown", answers="table", answer_table=_table_file(tmp_path, {}, fmt="other"))
    with pytest.raises(ValueError, match="does not exist"):
        get_suite("countdown", answers="table", answer_table=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="go together"):
        get_suite("countdown", answers="table")
    with pytest.raises(ValueError, match="go together"):
        get_suite("countdown", answer_table=_table_file(tmp_path, {}))


def test_countdown_pairs_mixes_in_two_number_problems_the_default_stream_unchanged():
    canonical = get_suite("countdown")
    base = canonical.examples("train", 500)
    assert [e.prompt for e in get_suite("countdown", pairs=0.0).examples("train", 500)] == [e.prompt for e in base]
    mixed = get_suite("countdown", pairs=0.3).examples("train", 1000)
    pairs = [e for e in mixed if len(e.meta["numbers"]) == 2]
    assert 0.1 < len(pairs) / len(mixed) < 0.35
    assert {e.answer.split()[1] for e in pairs} == set("+-*/")  # every operation is taught
    assert all(canonical.score(e, e.answer).correct for e in mixed)
    assert all(e.meta["target"] >= 1 for e in pairs)
    steps = get_suite("countdown", pairs=0.3, answers="steps").examples("train", 300)
    assert any(len(e.meta["numbers"]) == 2 and e.answer.count("=") == 1 for e in steps)
    for bad in (1.0, -0.1, "some", True):
        with pytest.raises(ValueError, match="pairs must be a number in"):
            get_suite("countdown", pairs=bad)
    with pytest.raises(ValueError, match="pairs is only for answers"):
        get_suite("countdown", pairs=0.2, answers="chain")
