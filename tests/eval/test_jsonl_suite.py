"""Your own JSON Lines examples as an evaluation suite: exact-match scoring and `dllm bench --suite my.jsonl`."""

import json

import pytest
from typer.testing import CliRunner

from dllm.eval.tasks import get_suite, resolve_suites
from dllm.eval.tasks.jsonl import DataFileError, FileSuite, is_data_file


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_examples_come_in_file_order_and_score_by_exact_match(tmp_path):
    f = _write(tmp_path / "mine.jsonl", [
        {"prompt": "reverse sort : Ann Cal Bob", "response": "Cal Bob Ann"},
        {"messages": [{"role": "user", "content": "copy : Ann"}, {"role": "assistant", "content": "Ann"}]},
        {"prompt": "copy : Bob", "completion": "Bob"},
    ])
    s = FileSuite(f)
    exs = s.examples("test", 10)
    assert s.name == "mine" and [e.prompt for e in exs] == ["reverse sort : Ann Cal Bob", "copy : Ann", "copy : Bob"]
    assert s.examples("test", 2) == exs[:2] and {e.suite for e in exs} == {"mine"}
    assert s.score(exs[0], "  Cal  Bob\nAnn ").correct  # whitespace runs are one space
    assert not s.score(exs[0], "Cal Ann Bob").correct and s.score(exs[0], "Cal").reward == 0.0
    assert s.max_answer_tokens == 3


def test_multi_turn_examples_cannot_be_scored(tmp_path):
    f = _write(tmp_path / "chat.jsonl", [{"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "copy : Ann"},
        {"role": "assistant", "content": "Ann"}]}])
    with pytest.raises(DataFileError, match=r"example 1 has prompt turns \['system', 'user'\]"):
        FileSuite(f)


def test_resolve_suites_mixes_names_and_files(tmp_path):
    a = _write(tmp_path / "gsm.jsonl", [{"prompt": "x", "response": "y"}])
    suites = resolve_suites(f"arith,{a},arith")
    assert [s.name for s in suites] == ["arith", "gsm-2"]  # never shadows a registered suite
    assert [s.name for s in resolve_suites(f"{a},all,lists")] == ["gsm-2", "arith", "gsm", "lists", "sudoku",
                                                                  "countdown"]
    assert is_data_file("x/My.JSONL") and not is_data_file("lists")
    with pytest.raises(DataFileError, match="does not exist"):
        resolve_suites(str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"must be JSON Lines named \*\.jsonl"):
        resolve_suites("arith,mine.json")


def test_bench_on_a_file_equals_bench_on_the_suite_it_was_written_from(tmp_path):
    """Same prompts, so the same decoding; exact match agrees with the arith scorer on this model."""
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    exs = get_suite("arith").examples("test", 6, seed=0)
    f = _write(tmp_path / "myarith.jsonl", [{"prompt": e.prompt, "response": e.answer} for e in exs])
    reports = {}
    for spec in ("arith", str(f)):
        out = tmp_path / f"{len(reports)}.json"
        res = CliRunner().invoke(app, ["bench", "--model", "tiny", "--suite", spec, "--n", "6", "--strategies",
                                       "vanilla,threshold", "--threads", "1", "--no-progress", "--json", str(out)])
        assert res.exit_code == 0, res.output
        reports[spec] = json.loads(out.read_text())
    for a, b in zip(reports["arith"]["results"], reports[str(f)]["results"]):
        pa, pb = a["per_suite"]["arith"], b["per_suite"]["myarith"]
        assert pa["n"] == pb["n"] == 6 and pa["tpf"] == pb["tpf"]
        assert (a["generated_tokens"], a["forwards"]) == (b["generated_tokens"], b["forwards"])
        assert a["accuracy"] == b["accuracy"] > 50


def test_a_bad_data_file_fails_before_the_model_loads(tmp_path):
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "x"}\n')
    res = CliRunner().invoke(app, ["bench", "--model", "no-such-model", "--suite", str(f), "--no-progress"])
    assert res.exit_code == 2 and "neither form" in res.output and "Traceback" not in res.output
