"""benchmarks/exclusion_probe.py: probability on names already written in `shuffle` answers."""

import pytest


def test_teacher_excludes_visible_names(capsys, run_benchmark):
    result = run_benchmark("exclusion_probe", ["--models", "tiny", "--n", "120"])
    assert result["problems"] > 0 and result["slots"] > 0
    assert 0.0 < result["ignore_level"] < 1.0
    # the bidirectional teacher puts far less than the ignore-the-answer level on names already written
    assert 0.0 <= result["models"]["tiny"] < result["ignore_level"] / 3
    same_block, next_block = result["sensitivity"]["tiny"]
    assert same_block > 0.1 and next_block > 0.0  # bidirectional: every answer slot sees every other
    assert "ignore-answer level" in capsys.readouterr().out


def test_block_causal_student_sees_its_own_block_only(run_benchmark):
    result = run_benchmark("exclusion_probe", ["--models", "tiny-d2f", "--n", "120"])
    same_block, next_block = result["sensitivity"]["tiny-d2f"]
    assert same_block > 0.1 and next_block == 0.0
    assert 0.0 <= result["models"]["tiny-d2f"] < result["ignore_level"]


def test_bad_input_is_a_clear_error(run_benchmark):
    with pytest.raises(SystemExit, match="no shuffle problems"):
        run_benchmark("exclusion_probe", ["--models", "tiny", "--n", "1"])
    with pytest.raises(SystemExit, match="too short"):
        run_benchmark("exclusion_probe", ["--models", "tiny", "--canvas", "9"])
