"""Suite-independent guarantees: registry, determinism, disjoint splits, budgets, self-scoring."""
import json
import os
import re
import subprocess
import sys

import pytest

from dllm.eval.tasks import Example, count_tokens, get_suite, resolve_suites, split_of_key, suite_names
from dllm.eval.tasks.lists import ListsSuite

NAMES = ["arith", "gsm", "lists", "sudoku", "countdown"]


@pytest.fixture(scope="module")
def pools():
    """3000 train + 300 test examples per suite (seed 0), generated once."""
    return {n: (get_suite(n).examples("train", 3000), get_suite(n).examples("test", 300)) for n in NAMES}


def test_registry():
    assert suite_names() == NAMES
    assert [s.name for s in resolve_suites("all")] == NAMES
    assert [s.name for s in resolve_suites(" gsm, arith ,gsm")] == ["gsm", "arith"]
    with pytest.raises(ValueError, match="valid suites: arith, gsm, lists, sudoku, countdown"):
        get_suite("mmlu")
    with pytest.raises(ValueError, match=r"get_suite\('longlists', max_items=16\).*resolve_suites\("):
        get_suite("longlists:max_items=10")
    assert [s.distinct[0] for s in resolve_suites("longlists:min_items=7,max_items=10")] == [7]
    with pytest.raises(ValueError, match="valid suites"):
        resolve_suites("arith,nope")
    with pytest.raises(ValueError):
        resolve_suites(" , ")


def test_resolve_suites_takes_options_after_a_colon():
    s9, ll, ar = resolve_suites("sudoku9:blanks=40, longlists:min_items=8,max_items=16,ops=sort+dedupe, arith")
    assert (s9.blanks, ll.items, ll.ops, ar.name) == (40, (8, 16), ("sort", "dedupe"), "arith")
    assert [s.name for s in resolve_suites("long,longlists")] == ["sudoku9", "longlists", "chain"]
    assert resolve_suites("sudoku9:blanks=40,sudoku9:blanks=40")[0].blanks == 40
    assert resolve_suites("sudoku9:")[0].blanks == 30  # a colon with nothing after it: no options
    for spec, match in [("arith,width=3", "does not take options"), ("blanks=3", "before any name"),
                        ("sudoku9:blanks=4:x=1", "separate parameters with commas"), ("sudoku9:blanks=99", "blanks"),
                        ("arith:width=3", "does not take options"),
                        ("longlists,longlists:max_items=12", "twice .* different options"),
                        ("long:max_items=3", "group of suites takes no options")]:
        with pytest.raises(ValueError, match=match):
            resolve_suites(spec)


def test_get_suite_passes_options_and_names_a_bad_one():
    ops = {e.meta["op"] for e in get_suite("lists", ops=["copy", "sort"]).examples("train", 50)}
    assert ops == {"copy", "sort"}
    with pytest.raises(ValueError, match="'arith' does not take options \\['ops'\\]; it takes: none"):
        get_suite("arith", ops=["copy"])
    with pytest.raises(ValueError, match="valid ops"):
        get_suite("lists", ops=["juggle"])
    with pytest.raises(ValueError, match="'lists' does not take options \\['opz'\\]; it takes: ops"):
        get_suite("lists", opz=["copy"])


@pytest.mark.parametrize("name", NAMES)
def test_bad_split_and_n(name):
    suite = get_suite(name)
    with pytest.raises(ValueError, match="valid splits: train, test"):
        suite.examples("dev", 3)
    with pytest.raises(ValueError):
        suite.examples("train", -1)
    assert suite.examples("test", 0) == []


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_prefix_stable(name):
    a = get_suite(name).examples("train", 40, seed=3)
    b = get_suite(name).examples("train", 40, seed=3)
    assert a == b
    assert get_suite(name).examples("train", 15, seed=3) == a[:15]
    assert get_suite(name).examples("train", 40, seed=4) != a
    assert a[0].id == f"{name}-train-s3-00000" and a[-1].id == f"{name}-train-s3-00039"
    assert get_suite(name).examples("test", 18)[17].id == f"{name}-test-00017"


_DIGEST_CODE = """
import hashlib, json
from dllm.eval.tasks import get_suite, suite_names
rows = [[e.id, e.prompt, e.answer, e.meta] for n in suite_names("every") for e in get_suite(n).examples("test", 30)]
print(hashlib.sha1(json.dumps(rows, sort_keys=True).encode()).hexdigest())
"""


@pytest.mark.slow
def test_independent_of_hash_seed():
    """Same examples in fresh interpreters with different PYTHONHASHSEED values (every suite, long ones too)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outs = {
        subprocess.run(
            [sys.executable, "-c", _DIGEST_CODE], cwd=root, capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": root},
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1 and len(outs.pop()) == 40


def test_golden_first_test_examples():
    """Pins the generators: changing them silently would change every published number."""
    first = {n: get_suite(n).examples("test", 1)[0] for n in NAMES}
    assert (first["arith"].prompt, first["arith"].answer) == ("What is 35 + 84 ?", "119")
    assert first["gsm"].answer == "22 + 15 = 37 . 22 + 37 = 59 . #### 59"
    assert first["lists"].prompt == "sort : Pam Lee Ann Max Bob Oli Ned Eve"
    assert first["sudoku"].prompt == "sudoku : 0 0 0 2 / 2 1 4 3 / 3 0 0 1 / 1 0 3 4"
    assert (first["countdown"].prompt, first["countdown"].answer) == ("numbers 14 8 20 target 26 :", "14 - 8 + 20")


def _independent_key(name: str, e: Example) -> tuple:
    """A problem identity rebuilt from the prompt text alone (not from the suite's own key)."""
    ints = tuple(int(x) for x in re.findall(r"\d+", e.prompt))
    if name == "arith":
        a, op, b = e.prompt.split()[2:5]
        return (op, *sorted((int(a), int(b)))) if op in "+*" else (op, int(a), int(b))
    if name == "gsm":  # names and nouns do not change the maths
        return (e.meta["template"], ints)
    if name == "countdown":
        return (tuple(sorted(ints[:3])), ints[3])
    return (e.prompt,)  # lists, sudoku: the prompt is the whole problem


@pytest.mark.parametrize("name", NAMES)
def test_train_test_disjoint(pools, name):
    train, test = pools[name]
    tr = {e.meta["key"] for e in train}
    te = {e.meta["key"] for e in test}
    assert len(tr) == 3000 and len(te) == 300  # distinct within a split
    assert not tr & te
    assert all(split_of_key(k) == "test" for k in te) and all(split_of_key(k) == "train" for k in tr)
    itr = {_independent_key(name, e) for e in train}
    ite = {_independent_key(name, e) for e in test}
    assert len(ite) == 300 and not itr & ite


@pytest.mark.parametrize("name", NAMES)
def test_reference_answers_score_correct(pools, name):
    suite = get_suite(name)
    train, test = pools[name]
    for e in train[:300] + test:
        for completion in (e.answer, f"  {e.answer}  \n", e.answer + "\n\nQuestion : junk words"):
            s = suite.score(e, completion)
            assert s.correct and s.reward == 1.0, (e, completion, s)


@pytest.mark.parametrize("name", NAMES)
def test_token_budgets(pools, name):
    suite = get_suite(name)
    train, test = pools[name]
    assert suite.max_prompt_tokens <= 60 and suite.max_answer_tokens <= 40
    assert max(count_tokens(e.prompt) for e in train + test) <= suite.max_prompt_tokens
    assert max(count_tokens(e.answer) for e in train + test) <= suite.max_answer_tokens
    assert all(e.prompt.isascii() and e.answer.isascii() for e in train + test)
    assert all(e.suite == name for e in train + test)
    json.dumps([e.meta for e in test])  # meta is JSON-serialisable


def test_count_tokens():
    assert count_tokens("What is 123 + 45 ?") == 9
    assert count_tokens("12 + 7 = 19 . #### 19") == 14
    assert count_tokens("  Ann's   pens\n") == 4
    assert count_tokens("") == 0


def test_lists_ops_subset():
    suite = ListsSuite(ops=["copy", "shuffle"])
    assert {e.meta["op"] for e in suite.examples("train", 100)} == {"copy", "shuffle"}
    with pytest.raises(ValueError, match="valid ops"):
        ListsSuite(ops=["rotate"])


def test_small_problem_space_raises():
    from dllm.eval.tasks.base import Problem, Score, TaskSuite

    class Tiny(TaskSuite):
        name, max_prompt_tokens, max_answer_tokens = "tiny", 5, 5

        def _draw(self, rng):
            k = str(rng.randrange(30))
            return Problem(k, k, k, {})

        def score(self, example, completion):
            return Score(completion == example.answer, 1.0, {})

    assert len(Tiny().examples("train", 20)) == 20
    with pytest.raises(ValueError, match="could only find"):
        Tiny().examples("train", 40)
