"""benchmarks/mask_ratio_probe.py: masked-token accuracy of the bundled model per mask ratio."""

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "mask_ratio_probe.py"


def _load():
    spec = importlib.util.spec_from_file_location("mask_ratio_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_probe_reports_every_mode_and_ratio(capsys):
    threads = torch.get_num_threads()
    try:
        result = _load().main(["--suite", "lists", "--categories", "copy", "--n", "40", "--ratios", "0.5,1.0"])
    finally:
        torch.set_num_threads(threads)
    assert set(result) == {(m, t) for m in ("all", "eos_revealed") for t in (0.5, 1.0)}
    for row in result.values():
        assert 0.0 <= row["accuracy"] <= 100.0 and row["ce"] >= 0.0 and 0.0 <= row["rows_with_error"] <= 100.0
    # the bundled model copies a list almost perfectly from a fully masked answer
    assert result[("all", 1.0)]["accuracy"] > 80.0
    assert "eos_revealed" in capsys.readouterr().out


def test_unknown_category_is_a_clear_error():
    with pytest.raises(SystemExit, match="no test problems"):
        _load().main(["--suite", "lists", "--categories", "juggle", "--n", "10"])
