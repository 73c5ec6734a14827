"""benchmarks/gsm_failures.py: each wrong gsm answer is a slip, a miscopied final, a wrong chain or no equation."""

import json

import pytest


def test_classify(load_benchmark):
    classify = load_benchmark("gsm_failures").classify
    right = "12 * 9 = 108 . 108 - 18 = 90 . #### 90"
    assert classify(right, True) == ("correct", None)
    assert classify("12 * 9 = 108 . 108 - 18 = 80 . #### 80", False) == ("arithmetic slip", 2)
    assert classify("12 * 9 = 107 . 107 - 18 = 89 . #### 89", False) == ("arithmetic slip", 1)
    assert classify("12 * 9 = 108 . 108 - 18 = 90 . #### 91", False) == ("final copied wrong", None)
    assert classify("12 * 9 = 108 . #### 108", False) == ("wrong chain", None)
    assert classify("#### 90", False) == ("no equation", None)


def test_counts_add_up(run_benchmark, tmp_path):
    out = tmp_path / "r.json"
    result = run_benchmark("gsm_failures", ["--n", "6", "--batch-size", "4", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    counts = result["counts"]
    assert sum(counts.values()) == result["n"] == 6
    assert sum(result["first_slip_step"].values()) == counts["arithmetic slip"]
    # step 1 reads its operands from the question; the bundled tiny does not slip there on these
    assert "1" not in result["first_slip_step"]


def test_bad_input_is_a_clear_error(run_benchmark):
    with pytest.raises(SystemExit, match="valid:"):
        run_benchmark("gsm_failures", ["--strategy", "greedy"])
    with pytest.raises(SystemExit, match="at least 1"):
        run_benchmark("gsm_failures", ["--n", "0"])
