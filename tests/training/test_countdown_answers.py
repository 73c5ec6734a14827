"""training/countdown_answers.py: a countdown answer table from a model's own preferences."""

import json

import pytest
import torch

from dllm.eval.tasks import get_suite
from dllm.eval.tasks.base import split_of_key
from dllm.eval.tasks.countdown import all_solutions, load_answer_table
from dllm.loading import load_model
from dllm.training.countdown_answers import build_table, main, score_answers, training_problems
from dllm.training.encoding import encode_answer, encode_prompt


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny").eval()


def test_training_problems_are_the_train_split():
    problems = training_problems()
    keys = {" ".join(map(str, n)) + f"={t}" for n, t in problems}
    assert len(keys) == len(problems) > 10_000
    assert all(split_of_key(k) == "train" for k in keys)
    assert all(list(n) == sorted(n) and 1 <= t <= 100 and t in all_solutions(n) for n, t in problems)
    assert {e.meta["key"] for e in get_suite("countdown").examples("train", 300)} <= keys


def test_scores_are_log_probs_of_the_padded_answer(tiny, tokenizer):
    prompt, answers = "numbers 3 6 7 target 39 :", ["3 * ( 6 + 7 )", "6 * 7 - 3"]
    together = score_answers(tiny, tokenizer, prompt, answers, 64, 32)
    alone = [score_answers(tiny, tokenizer, prompt, [a], 64, 32)[0] for a in answers]
    assert together == pytest.approx(alone, abs=1e-4)
    # by hand: one forward over prompt + 64 masks, log-softmax at each of the first 32 answer slots
    q = encode_prompt(tokenizer, prompt)
    with torch.no_grad():
        logits = tiny(torch.tensor([q + [tokenizer.mask_token_id] * 64])).logits[0, len(q):len(q) + 32]
    logp = torch.log_softmax(logits, -1)
    ids = encode_answer(tokenizer, answers[1])
    ids += [tokenizer.eos_token_id] * (32 - len(ids))
    assert together[1] == pytest.approx(sum(logp[i, t].item() for i, t in enumerate(ids)), abs=1e-3)
    assert all(s < 0 for s in together)


def test_table_keeps_the_best_scoring_solution(tiny, tokenizer, tmp_path):
    problems = [p for p in training_problems() if len(all_solutions(p[0])[p[1]]) > 1][:40]
    table = build_table(tiny, tokenizer, problems=problems, progress=False)
    assert table["with_several_solutions"] == 40 and 0 < table["changed"] <= 40
    for key, expression in table["answers"].items():
        numbers, target = tuple(int(x) for x in key.split("=")[0].split()), int(key.split("=")[1])
        candidates = all_solutions(numbers)[target]
        scores = score_answers(tiny, tokenizer, f"numbers {' '.join(map(str, numbers))} target {target} :",
                               list(candidates), 64, 32)
        assert expression != candidates[0] and scores[candidates.index(expression)] == max(scores)
    # a margin larger than any score gap keeps every canonical answer
    assert build_table(tiny, tokenizer, margin=1e6, problems=problems, progress=False)["changed"] == 0
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    assert load_answer_table(str(path)) == table["answers"]


def test_cli_writes_a_loadable_table(tmp_path, capsys):
    out = tmp_path / "sub" / "table.json"
    table = main(["--model", "tiny", "--out", str(out), "--limit", "60"])
    assert json.loads(out.read_text()) == table and table["training_problems"] == 60
    assert "get a non-canonical answer" in capsys.readouterr().out
    suite = get_suite("countdown", answers="table", answer_table=str(out))
    assert all(suite.score(e, e.answer).correct for e in suite.examples("train", 100))
    with pytest.raises(SystemExit, match="--margin"):
        main(["--model", "tiny", "--out", str(out), "--margin", "-1"])
    with pytest.raises(SystemExit, match="cannot load"):
        main(["--model", str(tmp_path / "nowhere"), "--out", str(out)])
