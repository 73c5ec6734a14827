"""benchmarks/exclusion_probe.py: probability on names already written in `shuffle` answers."""

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "exclusion_probe.py"


def _load():
    spec = importlib.util.spec_from_file_location("exclusion_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_teacher_excludes_visible_names(capsys):
    threads = torch.get_num_threads()
    try:
        result = _load().main(["--models", "tiny", "--n", "120"])
    finally:
        torch.set_num_threads(threads)
    assert result["problems"] > 0 and result["slots"] > 0
    assert 0.0 < result["ignore_level"] < 1.0
    # the bidirectional teacher puts far less than the ignore-the-answer level on names already written
    assert 0.0 <= result["models"]["tiny"] < result["ignore_level"] / 3
    assert "ignore-answer level" in capsys.readouterr().out


def test_no_shuffle_problem_is_a_clear_error():
    with pytest.raises(SystemExit, match="no shuffle problems"):
        _load().main(["--models", "tiny", "--n", "1"])
