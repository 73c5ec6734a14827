"""benchmarks/exclusion_probe.py: probability on names already written in `shuffle` answers."""

import pytest


def test_teacher_excludes_visible_names(capsys, run_benchmark):
    result = run_benchmark("exclusion_probe", ["--models", "tiny", "--n", "120"])
    assert result["problems"] > 0 and result["slots"] > 0
    assert 0.0 < result["ignore_level"] < 1.0
    # the bidirectional teacher puts far less than the ignore-the-answer level on names already written
    assert 0.0 <= result["models"]["tiny"] < result["ignore_level"] / 3
    assert "ignore-answer level" in capsys.readouterr().out


def test_no_shuffle_problem_is_a_clear_error(run_benchmark):
    with pytest.raises(SystemExit, match="no shuffle problems"):
        run_benchmark("exclusion_probe", ["--models", "tiny", "--n", "1"])
