"""benchmarks/merge_pareto.py: several bench reports in one Pareto plot."""

import json

import pytest


def _report(labels, **kw):
    base = {"model": "m", "suite": "gsm", "n": 10, "seed": 0,
            "results": [{"label": lab, "tpf": 1.0 + i, "accuracy": 90.0 - i} for i, lab in enumerate(labels)]}
    return {**base, **kw}


def test_merge_keeps_each_method_once(load_benchmark):
    merge = load_benchmark("merge_pareto").merge
    out = merge([_report(["d2f", "d2f:skip_threshold=0.9"]), _report(["d2f", "lopa:lopa_branches=2"])])
    assert [r["label"] for r in out["results"]] == ["d2f", "d2f:skip_threshold=0.9", "lopa:lopa_branches=2"]
    assert out["model"] == "m" and out["n"] == 10


def test_merge_refuses_incomparable_reports(load_benchmark):
    merge = load_benchmark("merge_pareto").merge
    with pytest.raises(ValueError, match="n .10 vs 600."):
        merge([_report(["d2f"]), _report(["lopa"], n=600)])
    with pytest.raises(ValueError, match="no reports"):
        merge([])


def test_cli_writes_the_plot_and_exits_cleanly_on_bad_input(tmp_path, capsys, run_benchmark):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_report(["d2f", "x"])))
    b.write_text(json.dumps(_report(["d2f", "y"])))
    out = tmp_path / "p.png"
    merged = run_benchmark("merge_pareto", [str(a), str(b), "--out", str(out)])
    assert out.stat().st_size > 1000 and len(merged["results"]) == 3
    assert "3 methods from 2 reports" in capsys.readouterr().out
    b.write_text(json.dumps(_report(["y"], model="other")))
    with pytest.raises(SystemExit) as e:
        run_benchmark("merge_pareto", [str(a), str(b), "--out", str(out)])
    assert e.value.code == 2 and "model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_benchmark("merge_pareto", [str(tmp_path / "missing.json"), "--out", str(out)])


def test_output_paths_are_checked_before_any_work(tmp_path, capsys, run_benchmark):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(_report(["d2f"])))
    with pytest.raises(SystemExit) as e:
        run_benchmark("merge_pareto", [str(a), "--out", str(tmp_path / "plot.txt")])
    assert e.value.code == 2 and "unknown file format" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run_benchmark("lopa_ceiling", ["--suite", "arith", "--n", "1", "--json", str(tmp_path)])
    assert e.value.code == 2 and "is a folder" in capsys.readouterr().err
