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


def test_monitor_scores_a_checkpoint_of_a_run_folder(tmp_path, capsys):
    from dllm.training.config import SFTConfig, load_config
    from dllm.training.sft import SFTTrainer

    from .conftest import micro_overrides

    run = tmp_path / "run"
    SFTTrainer(load_config(SFTConfig, None, micro_overrides(run, max_steps=4, save_every=2))).run()
    main([str(run), "--step", "2", "--suites", "arith", "--n", "2", "--gen-length", "8", "--threads", "1"])
    out = capsys.readouterr().out
    assert f"{run}: checkpoint step-0000002 (step 2)" in out and "arith" in out and "(n=2, gen_length=8" in out
    main([str(run / "checkpoints" / "step-0000004"), "--suites", "arith", "--n", "1", "--gen-length", "8"])
    assert "checkpoint step-0000004 (step 4)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        main([str(run), "--step", "3", "--suites", "arith"])
    assert err.value.code == 2 and "has no checkpoint of step 3 (checkpoints: 2, 4)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main([str(run / "final"), "--step", "3", "--suites", "arith"])
    assert err.value.code == 2 and "--step picks a checkpoint of a run folder" in capsys.readouterr().err
