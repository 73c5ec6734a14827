"""benchmarks/mask_ratio_probe.py: masked-token accuracy of the bundled model per mask ratio."""

import pytest


def test_probe_reports_every_mode_and_ratio(capsys, run_benchmark):
    argv = ["--suite", "lists", "--categories", "copy", "--n", "40", "--ratios", "0.5,1.0"]
    result = run_benchmark("mask_ratio_probe", argv)
    assert set(result) == {(m, t) for m in ("all", "eos_revealed") for t in (0.5, 1.0)}
    for row in result.values():
        assert 0.0 <= row["accuracy"] <= 100.0 and row["ce"] >= 0.0 and 0.0 <= row["rows_with_error"] <= 100.0
    # the bundled model copies a list almost perfectly from a fully masked answer
    assert result[("all", 1.0)]["accuracy"] > 80.0
    assert "eos_revealed" in capsys.readouterr().out


def test_unknown_category_is_a_clear_error(run_benchmark):
    with pytest.raises(SystemExit, match="no test problems"):
        run_benchmark("mask_ratio_probe", ["--suite", "lists", "--categories", "juggle", "--n", "10"])
