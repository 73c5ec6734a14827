"""The long-answer suites (sudoku9, longlists, chain): registry, generators, verifiers, splits, lengths."""
import hashlib
import json
import os

import pytest

from dllm.eval.tasks import count_tokens, get_suite, resolve_suites, split_of_key, suite_names
from dllm.eval.tasks.longlists import FULL_NAMES, LongListsSuite, apply_op, parse_full_names
from dllm.eval.tasks.sudoku9 import (
    DEFAULT_BLANKS,
    Sudoku9Suite,
    count_solutions,
    format_grid,
    is_valid_solution,
    naked_single_rounds,
)

LONG = ["sudoku9", "longlists", "chain"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "recipes", "tiny-long-sft.yaml")
SOLVED = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


@pytest.fixture(scope="module")
def pools():
    """400 train + 100 test examples per long suite (seed 0), generated once."""
    return {n: (get_suite(n).examples("train", 400), get_suite(n).examples("test", 100)) for n in LONG}


def test_groups_and_registry():
    assert suite_names("long") == LONG
    assert suite_names() == ["arith", "gsm", "lists", "sudoku", "countdown"]  # "all" keeps its meaning
    assert suite_names("every") == suite_names() + LONG
    assert [s.name for s in resolve_suites("long")] == LONG
    assert [s.name for s in resolve_suites("chain,all,long")][:2] == ["chain", "arith"]
    assert len(resolve_suites("every")) == 8
    with pytest.raises(ValueError, match="valid groups: all, long, every"):
        suite_names("short")
    with pytest.raises(ValueError, match="sudoku9, longlists, chain"):
        get_suite("sudoku16")
    assert isinstance(get_suite("sudoku9"), Sudoku9Suite) and get_suite("sudoku9").blanks == DEFAULT_BLANKS
    with pytest.raises(ValueError, match="it takes: blanks"):
        get_suite("sudoku9", givens=30)
    for bad in (0, 61, 30.0, True):
        with pytest.raises(ValueError, match="blanks must be an int in"):
            get_suite("sudoku9", blanks=bad)
    with pytest.raises(ValueError, match="valid ops: copy, reverse, sort, dedupe"):
        LongListsSuite(ops=["shuffle"])


def test_count_solutions():
    assert is_valid_solution(SOLVED)
    assert count_solutions(SOLVED) == 1
    assert count_solutions("0" * 81) == 2 and count_solutions("0" * 81, limit=5) == 5
    clash = "55" + SOLVED[2:]
    assert count_solutions(clash) == 0 and not is_valid_solution(clash)
    # every 1 and 2 blanked: swapping the two digits everywhere gives a second solution
    assert count_solutions("".join("0" if ch in "12" else ch for ch in SOLVED)) == 2
    one_blank = "0" + SOLVED[1:]
    assert count_solutions(one_blank) == 1 and naked_single_rounds(one_blank) == 1
    assert naked_single_rounds(SOLVED) == 0


@pytest.mark.parametrize("blanks", [DEFAULT_BLANKS, 45])
def test_sudoku9_puzzles_have_one_solution(blanks):
    suite = get_suite("sudoku9", blanks=blanks)
    for e in suite.examples("test", 15) + suite.examples("train", 15):
        puzzle, solution = e.meta["puzzle"], e.meta["solution"]
        assert puzzle.count("0") == blanks == e.meta["blanks"]
        assert is_valid_solution(solution)
        assert all(p in ("0", s) for p, s in zip(puzzle, solution))
        assert count_solutions(puzzle, limit=2) == 1
        assert e.prompt == f"sudoku : {format_grid(puzzle)}" and e.answer == format_grid(solution)
        rounds = naked_single_rounds(puzzle)
        assert e.meta["rounds"] == rounds
        assert suite.category(e) == ("more than singles" if rounds is None else f"{rounds} rounds")


def test_sudoku9_scores_partial_credit():
    suite = get_suite("sudoku9")
    e = suite.examples("test", 1)[0]
    puzzle, solution = e.meta["puzzle"], e.meta["solution"]
    blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
    s = suite.score(e, e.answer)
    assert s.correct and s.reward == 1.0 and s.details["cell_accuracy"] == 1.0
    # two blank cells swapped (different digits): 79 of 81 cells right
    i, j = next((i, j) for i in blanks for j in blanks if solution[i] != solution[j])
    wrong = list(solution)
    wrong[i], wrong[j] = wrong[j], wrong[i]
    s = suite.score(e, format_grid("".join(wrong)))
    assert not s.correct
    assert s.details["cell_accuracy"] == pytest.approx(79 / 81)
    assert s.details["blank_accuracy"] == pytest.approx((len(blanks) - 2) / len(blanks))
    assert s.reward == pytest.approx(0.5 * (len(blanks) - 2) / len(blanks))
    # the puzzle copied back (givens right, blanks 0): no blank right
    s = suite.score(e, format_grid(puzzle))
    assert not s.correct and s.reward == 0.0 and s.details["cell_accuracy"] == pytest.approx(51 / 81)
    # a grid cut short: the missing cells count as wrong
    s = suite.score(e, e.answer[:40])
    assert not s.correct and s.details["cell_accuracy"] == pytest.approx(len(s.details["parsed"]) / 81)
    assert not suite.score(e, "").correct


def test_longlists_ops_and_parse():
    items = ["Pam Lee", "Ann Bob", "Pam Kim", "Ann Bob", "Cal Dee", "Pam Lee"]
    assert apply_op("sort", items) == ["Ann Bob", "Ann Bob", "Cal Dee", "Pam Kim", "Pam Lee", "Pam Lee"]
    assert apply_op("dedupe", items) == ["Pam Lee", "Ann Bob", "Pam Kim", "Cal Dee"]
    assert apply_op("reverse", items[:3]) == ["Pam Kim", "Ann Bob", "Pam Lee"]
    assert parse_full_names("Ann Bob , Cal Dee , Eve") == ["Ann Bob", "Cal Dee"]
    assert parse_full_names("Ann Bob , Cal Dee Eve , Fay Gus") == ["Ann Bob", "Cal Dee"]
    assert parse_full_names("  Ann Bob , Cal Dee\nEve Fay") == ["Ann Bob", "Cal Dee"]
    assert parse_full_names("Ann , Bob Cal") == [] and parse_full_names("") == []
    assert len(FULL_NAMES) == 240 and len(set(FULL_NAMES)) == 240


def test_longlists_generators(pools):
    for e in pools["longlists"][0] + pools["longlists"][1]:
        m = e.meta
        assert m["answer"] == apply_op(m["op"], m["items"])
        if m["op"] == "dedupe":
            assert 22 <= len(m["answer"]) <= 40 and 4 <= len(m["items"]) - len(m["answer"]) <= 8
        else:
            assert 22 <= len(m["items"]) <= 48 and len(set(m["items"])) == len(m["items"])
    assert {e.meta["op"] for e in pools["longlists"][1]} == {"copy", "reverse", "sort", "dedupe"}
    assert {e.meta["op"] for e in LongListsSuite(ops=["sort"]).examples("train", 20)} == {"sort"}


def test_longlists_default_problems_are_pinned():
    """The length knob must not move the held-out set every published longlists number is on."""
    ex = get_suite("longlists").examples("test", 600)
    digest = hashlib.sha256("\n".join(e.prompt + "|" + e.answer for e in ex).encode()).hexdigest()
    assert digest[:16] == "6ee3c0037ba9b8c8"


@pytest.mark.parametrize("lo,hi", [(4, 12), (1, 8), (20, 30), (48, 48)])
def test_longlists_length_knob(lo, hi):
    ops = ["copy", "sort"] if lo == hi else None  # a dedupe list needs room for its repeats
    suite = LongListsSuite(ops=ops, min_items=lo, max_items=hi)
    assert suite.max_answer_tokens == 3 * hi - 1 and suite.max_prompt_tokens == 9 + 3 * hi - 1
    for e in suite.examples("train", 200):
        m = e.meta
        assert m["answer"] == apply_op(m["op"], m["items"]) and lo <= len(m["answer"]) <= hi
        assert len(m["items"]) <= hi
        if m["op"] == "dedupe":
            assert len(m["items"]) > len(m["answer"])
        assert count_tokens(e.answer) <= suite.max_answer_tokens


def test_longlists_length_knob_defaults_and_errors():
    assert LongListsSuite().items == (22, 48)
    assert LongListsSuite(max_items=12).items == (6, 12) and LongListsSuite(max_items=46).items == (22, 46)
    for bad, match in [({"min_items": 0}, "from 1 to 48"), ({"max_items": 49}, "from 1 to 48"),
                       ({"min_items": True}, "whole number"), ({"min_items": 10, "max_items": 5}, "above max_items"),
                       ({"min_items": 10, "max_items": 10}, "room for up to 1 repeated")]:
        with pytest.raises(ValueError, match=match):
            LongListsSuite(**bad)


def test_longlists_scores_partial_credit():
    suite = get_suite("longlists")
    e = next(x for x in suite.examples("test", 20) if x.meta["op"] == "copy")
    want = e.meta["answer"]
    n = len(want)
    assert suite.score(e, e.answer).correct
    # one name dropped from the middle: every later position shifts
    dropped = want[: n // 2] + want[n // 2 + 1 :]
    s = suite.score(e, " , ".join(dropped))
    assert not s.correct and s.reward == pytest.approx(0.5 * (n // 2) / n)
    # two names swapped
    swapped = list(want)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    s = suite.score(e, " , ".join(swapped))
    assert not s.correct and s.reward == pytest.approx(0.5 * (n - 2) / n)
    # one name too many: every position right, still wrong
    s = suite.score(e, e.answer + " , Ann Bob")
    assert not s.correct and s.reward == pytest.approx(0.5 * n / (n + 1))


def test_chain_generator_and_scores(pools):
    suite = get_suite("chain")
    for e in pools["chain"][0] + pools["chain"][1]:
        steps = e.meta["steps"]
        assert 8 <= len(steps) == e.meta["n_steps"] <= 16
        total = steps[0][0]
        for a, op, b in steps:
            assert a == total and 10 <= a <= 99 and b >= 2 and (op != "*" or b <= 9)
            total = {"+": a + b, "-": a - b, "*": a * b}[op]
            assert 10 <= total <= 99
        assert total == e.meta["answer"] and e.answer.endswith(f"#### {total}")
    e = pools["chain"][1][0]
    gold, n = e.meta["answer"], e.meta["n_steps"]
    s = suite.score(e, e.answer)
    assert s.correct and s.details["steps_right"] == n
    # wrong final result, every equation right: incorrect, but half credit for the steps
    s = suite.score(e, e.answer.rsplit("####", 1)[0] + f"#### {gold + 1}")
    assert not s.correct and s.reward == pytest.approx(0.5)
    # a slip in the third equation: two steps right, and the result is wrong
    parts = e.answer.split(" . ")
    a, op, b, _, c = parts[2].split()
    parts[2] = f"{a} {op} {b} = {int(c) + 1}"
    s = suite.score(e, " . ".join(parts[:3]) + f" . #### {gold + 3}")
    assert not s.correct and s.details["steps_right"] == 2 and s.reward == pytest.approx(0.5 * 2 / n)
    assert s.details["leading_steps_accuracy"] == pytest.approx(2 / n)
    assert suite.category(e) == f"{n} steps"


@pytest.mark.parametrize("name", LONG)
def test_train_test_disjoint_and_deterministic(pools, name):
    train, test = pools[name]
    tr, te = {e.meta["key"] for e in train}, {e.meta["key"] for e in test}
    assert len(tr) == 400 and len(te) == 100 and not tr & te
    assert all(split_of_key(k) == "test" for k in te) and all(split_of_key(k) == "train" for k in tr)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert get_suite(name).examples("test", 100) == test
    assert get_suite(name).examples("test", 30) == test[:30]
    assert get_suite(name).examples("test", 30, seed=1) != test[:30]


@pytest.mark.parametrize("name", LONG)
def test_answer_lengths_and_budgets(pools, name):
    suite = get_suite(name)
    train, test = pools[name]
    answers = [count_tokens(e.answer) for e in train + test]
    assert 64 <= min(answers) and max(answers) <= suite.max_answer_tokens <= 256
    assert max(count_tokens(e.prompt) for e in train + test) <= suite.max_prompt_tokens
    for e in train[:100] + test:
        for completion in (e.answer, f"  {e.answer}  \n", e.answer + "\n\nQuestion : junk words"):
            assert suite.score(e, completion).correct, (e, completion)
    json.dumps([e.meta for e in test])
    assert len({suite.category(e) for e in test}) >= 3


def test_golden_first_test_examples():
    """Pins the generators: changing them silently would change every published number."""
    s9, ll, ch = (get_suite(n).examples("test", 1)[0] for n in LONG)
    assert s9.meta["puzzle"] == "495628700800703090307094600089036107740980036632007085273451009968070051100860300"
    assert ll.prompt.startswith("reverse : Pam Lee , Eve Fay , Hal Lee , Hal Gus") and ll.prompt.endswith("Max Bob")
    assert ch.prompt == ("What is 31 - 9 then - 3 then + 2 then + 43 then - 38 then * 3 then + 10 then - 66 "
                         "then + 26 then - 28 then + 23 then - 9 then + 14 then + 44 ?")
    assert ch.answer.endswith(". 48 + 44 = 92 . #### 92")


def test_suite_tokenizers_cover_the_long_suites(pools):
    """The long suites use only the short suites' words: the tokenizer training builds from the suites
    (``suite_texts``) and the bundled one cover them with no unknown token, and a rebuilt padded tokenizer
    pads only the first cell of a 9x9 grid."""
    from dllm.tokenization import build_tokenizer, load_tokenizer
    from dllm.training.data import suite_texts

    texts = suite_texts(n_per_split=200)
    plain, padded = build_tokenizer(texts), build_tokenizer(texts, pad_numbers=2)
    bundled = load_tokenizer(os.path.join(ROOT, "dllm", "bundled", "tiny"))
    for name in LONG:
        for e in pools[name][1][:30]:
            for text in (e.prompt, e.answer):
                for tok in (plain, padded, bundled):
                    ids = tok(text, add_special_tokens=False)["input_ids"]
                    assert tok.unk_token_id not in ids and tok.decode(ids) == text, (name, text)
                assert len(plain.tokenize(text)) == count_tokens(text)
    grid = pools["sudoku9"][1][0].answer  # "4 9 5 6 2 8 7 1 3 / 8 2 6 ..."
    toks = padded.tokenize(grid)
    assert toks[:4] == ["▁∅", "4", "▁9", "▁5"] and toks.count("▁∅") == 1 and len(toks) == 90


def test_training_and_grpo_accept_the_long_suites(pools):
    """data.tasks takes the long suites' names, and GRPO's built-in scorer grades them by their verifiers."""
    from dllm.training.config import ConfigError, SFTConfig, load_config
    from dllm.training.rewards import Scorer

    cfg = load_config(SFTConfig, RECIPE, ["data.tasks={sudoku9: 1.0, chain: 0.5}"])
    assert cfg.data.tasks == {"sudoku9": 1.0, "chain": 0.5} and cfg.data.max_new_tokens == 256
    with pytest.raises(ConfigError, match="valid suites: .*sudoku9, longlists, chain"):
        load_config(SFTConfig, RECIPE, ["data.tasks={sudoku10: 1.0}"])
    phase2 = load_config(SFTConfig, RECIPE.replace("sft.yaml", "sft-phase2.yaml"))  # the bundled model's last phase
    assert phase2.data.tasks == dict.fromkeys(LONG, 1.0) and phase2.data.max_new_tokens == 256
    assert phase2.t_min == 0.0 and phase2.model.path == "runs/tiny-long/final"
    exs = [pools[n][1][0] for n in LONG]
    correct, reward = Scorer()(exs, [e.answer for e in exs])
    assert correct == [True] * 3 and reward == [1.0] * 3
    correct, reward = Scorer()(exs, [e.answer[: len(e.answer) // 2] for e in exs])
    assert correct == [False] * 3 and all(0.0 < r < 0.5 for r in reward)


def test_bench_reports_partial_credit_per_suite():
    """dllm bench's per-suite JSON carries the mean reward and each "*_accuracy" the scorer reports."""
    from dllm.eval.bench import parse_methods, run_bench
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer

    model, tok = load_model("tiny").eval(), load_tokenizer(resolve_model_path("tiny"))
    report = run_bench(model, tok, suites="long", methods=parse_methods("threshold"), n=1, batch_size=3,
                       base_overrides={"max_new_tokens": 16}, progress=False)
    per = report["results"][0]["per_suite"]
    assert set(per) == set(LONG)
    assert {"reward", "cell_accuracy", "blank_accuracy"} <= set(per["sudoku9"])
    assert "position_accuracy" in per["longlists"] and "reward" in per["chain"]
    for ps in per.values():
        assert ps["n"] == 1 and ps["accuracy"] == 0.0  # 16 tokens cannot hold any long answer
        assert all(0.0 <= v <= 100.0 for k, v in ps.items() if k == "reward" or k.endswith("_accuracy"))


def test_bundled_long_pair_shares_its_tokenizer_and_the_student_is_block_causal():
    """tiny-long-d2f is tiny-long's D2F student (recipes/tiny-long-d2f.yaml): the same shape and tokenizer,
    block-causal with blocks of 16, decoded by d2f over a 256-token canvas by default."""
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from dllm.training.config import DistillConfig, load_config

    teacher, student = load_model("tiny-long"), load_model("tiny-long-d2f")
    assert not teacher.is_block_causal and student.is_block_causal and student.spec.block_size == 16
    assert {n: p.shape for n, p in teacher.named_parameters()} == {n: p.shape for n, p in student.named_parameters()}
    tt, ts = (load_tokenizer(resolve_model_path(n)) for n in ("tiny-long", "tiny-long-d2f"))
    assert tt.get_vocab() == ts.get_vocab()
    gen = student.diffusion_generation_config
    assert gen.strategy == "d2f" and gen.block_length == 16 and gen.max_new_tokens == 256
    cfg = load_config(DistillConfig, os.path.join(ROOT, "recipes", "tiny-long-d2f.yaml"))
    assert cfg.teacher == cfg.model.path == "tiny-long" and cfg.block_size == 16
    assert cfg.data.tasks == dict.fromkeys(LONG, 1.0)
