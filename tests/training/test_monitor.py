"""``python -m dllm.training.monitor``: greedy accuracy of a checkpoint per suite, suites as dllm bench takes them."""
import pytest

from dllm.testing import save_tiny_checkpoint
from dllm.training.monitor import evaluate, main


def test_monitor_takes_suite_options_and_shows_failures(tmp_path, capsys):
    save_tiny_checkpoint(tmp_path / "m")
    main([str(tmp_path / "m"), "--suites", "lists:ops=copy,arith", "--n", "2", "--gen-length", "16",
          "--threads", "1", "--show", "1"])
    out = capsys.readouterr().out
    lists_part = out.split("lists")[1].split("arith")[0]
    assert "(n=2, gen_length=16" in out and "'copy :" in lists_part  # only copy problems were drawn


def test_monitor_names_a_bad_suite_spec(tmp_path, capsys):
    save_tiny_checkpoint(tmp_path / "m")
    with pytest.raises(SystemExit) as err:
        main([str(tmp_path / "m"), "--suites", "sudoku9:blanks=99"])
    assert err.value.code == 2 and "blanks must be" in capsys.readouterr().err


def test_evaluate_takes_suites_with_options(tmp_path):
    from dllm.eval.tasks import get_suite

    model, tok = save_tiny_checkpoint(tmp_path / "m")
    scores, details = evaluate(model, tok, [get_suite("lists", ops=["sort"]), "arith"], 2, 8, return_details=True)
    assert list(scores) == ["lists", "arith"] and all(p.startswith("sort :") for p, *_ in details["lists"])
