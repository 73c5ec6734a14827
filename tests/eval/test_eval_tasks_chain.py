"""The training-only ``chain`` suite: registry place, correctness by an independent evaluator, the
property it exists for (later steps read an earlier result), splits, budgets, vocabulary."""
import ast
import operator
import re

import pytest

from eval.tasks import count_tokens, get_suite, resolve_suites, suite_names, training_suite_names
from eval.tasks.gsm import equation_is_right, written_equations

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(expr: str) -> int:
    """The expression's value by Python's own parser (precedence and brackets), not the suite's code."""
    def walk(node):
        if isinstance(node, ast.BinOp):
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant)
        return node.value
    return walk(ast.parse(expr, mode="eval").body)


@pytest.fixture(scope="module")
def pool():
    suite = get_suite("chain")
    return suite, suite.examples("train", 3000), suite.examples("test", 300)


def test_selectable_by_name_but_not_in_all():
    assert training_suite_names() == ["chain"]
    assert "chain" not in suite_names()
    assert "chain" not in [s.name for s in resolve_suites("all")]
    assert [s.name for s in resolve_suites("gsm,chain")] == ["gsm", "chain"]
    with pytest.raises(ValueError, match="valid suites: arith, gsm, lists, sudoku, countdown, chain"):
        get_suite("chains")


def test_answers_are_right_and_self_score(pool):
    suite, train, test = pool
    for ex in train + test:
        expr = re.fullmatch(r"What is (.+) \?", ex.prompt).group(1)
        assert _evaluate(expr) == ex.meta["answer"]
        assert ex.answer.endswith(f"#### {ex.meta['answer']}")
        eqs = written_equations(ex.answer)
        assert len(eqs) == ex.meta["n_steps"] in (2, 3)
        assert all(equation_is_right(e) for e in eqs)
        assert all(0 <= v <= 999 for e in eqs for v in (e[0], e[2], e[3]))
        assert suite.score(ex, ex.answer).correct
        assert not suite.score(ex, ex.answer.rsplit(" ", 1)[0] + f" {ex.meta['answer'] + 1}").correct


def test_every_later_step_reads_an_earlier_result(pool):
    _, train, _ = pool
    right_operand = 0
    for ex in train:
        eqs = written_equations(ex.answer)
        for k in range(1, len(eqs)):
            earlier = {e[3] for e in eqs[:k]}
            assert eqs[k][0] in earlier or eqs[k][2] in earlier, ex
            right_operand += eqs[k][2] == eqs[k - 1][3] and eqs[k][0] != eqs[k - 1][3]
    # gsm's shop and more_than problems put the earlier result on the right; so does chain
    assert right_operand > len(train) // 10
    shapes = {ex.meta["shape"] for ex in train}
    assert shapes == {"total", "product_first", "product_right", "bracket"}
    assert {get_suite("chain").category(ex) for ex in train} == shapes


def test_splits_disjoint_and_budgets(pool):
    suite, train, test = pool
    assert not {e.meta["key"] for e in train} & {e.meta["key"] for e in test}
    assert max(count_tokens(e.prompt) for e in train + test) <= suite.max_prompt_tokens
    assert max(count_tokens(e.answer) for e in train + test) <= suite.max_answer_tokens


def test_uses_only_words_the_evaluation_suites_have(pool):
    # adding chain to a run must not change the tokenizer built from the evaluation suites
    _, train, test = pool
    words = set()
    for name in ("arith", "gsm", "countdown"):
        for ex in get_suite(name).examples("train", 300):
            words |= set((ex.prompt + " " + ex.answer).split())
    chain_words = {w for ex in train + test for w in (ex.prompt + " " + ex.answer).split() if not w.isdigit()}
    assert chain_words <= words, chain_words - words
