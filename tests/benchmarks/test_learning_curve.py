"""benchmarks/learning_curve.py: the phases of the bundled tiny stitched into one global-step curve."""

import pytest


def test_the_committed_phases_stitch_in_order(load_benchmark):
    lc = load_benchmark("learning_curve")
    rows = lc.stitch()
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[0] == 1000 and steps[-1] == 66500  # phases 7-17 shifted behind step 28000
    assert 28500 in steps and 31500 in steps and 33500 in steps and 36500 in steps
    assert 41500 in steps and 46000 in steps and 48000 in steps
    assert 50000 in steps and 57000 in steps and 62900 in steps and 64100 in steps
    # phase 16 (steps 60500-64100) trained and evaluated countdown only
    only_cd = [r for r in rows if 60500 < r["step"] <= 64100]
    assert len(only_cd) == 8 and all(set(r) == {"step", "countdown"} for r in only_cd)
    assert all(set(lc.SUITES) <= set(r) for r in rows if r not in only_cd)
    assert all(0.0 <= r[s] <= 100.0 for r in rows for s in lc.SUITES if s in r)


def test_an_offset_that_goes_back_in_steps_is_refused(load_benchmark, tmp_path):
    lc = load_benchmark("learning_curve")
    for name, steps in (("a", (500, 1000)), ("b", (500, 1000))):
        (tmp_path / name).mkdir()
        lines = ["step,arith,lists,gsm,sudoku,countdown,mean"] + [f"{s},0.5,0.5,0.5,0.5,0.5,0.5" for s in steps]
        (tmp_path / name / "eval.csv").write_text("\n".join(lines) + "\n")
    assert [r["step"] for r in lc.stitch((("a", 0), ("b", 1000)), tmp_path)] == [500, 1000, 1500, 2000]
    assert lc.stitch((("a", 0),), tmp_path)[0]["gsm"] == 50.0
    with pytest.raises(ValueError, match="does not follow"):
        lc.stitch((("a", 0), ("b", 0)), tmp_path)
    with pytest.raises(FileNotFoundError, match="missing"):
        lc.stitch((("nope", 0),), tmp_path)
    # a phase may name its csv file when one folder holds several runs
    assert [r["step"] for r in lc.stitch((("a/eval.csv", 0), ("b", 1000)), tmp_path)] == [500, 1000, 1500, 2000]


def test_main_writes_the_plot(run_benchmark, tmp_path):
    out = tmp_path / "curve.png"
    rows = run_benchmark("learning_curve", ["--out", str(out)])
    assert out.is_file() and out.stat().st_size > 10_000
    assert rows[-1]["step"] == 66500
