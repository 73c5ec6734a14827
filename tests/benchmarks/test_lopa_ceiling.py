"""benchmarks/lopa_ceiling.py: the one-block-per-round TPF ceiling next to d2f and LoPA."""

import json


def test_ceiling_rounds(load_benchmark):
    ceil = load_benchmark("lopa_ceiling").ceiling_rounds
    assert [ceil(n, 8) for n in (1, 7, 8, 9, 16, 17)] == [1, 1, 1, 2, 2, 3]
    assert ceil(0, 8) == 1  # a row still takes its first round


def test_ceiling_bounds_every_strategy(tmp_path, capsys, run_benchmark):
    path = tmp_path / "ceiling.json"
    result = run_benchmark("lopa_ceiling", ["--suite", "arith", "--n", "3", "--branches", "0,2",
                                            "--json", str(path)])
    rows = result["rows"]
    assert [r["lopa_branches"] for r in rows] == [0, 2]
    B = result["block_length"]
    for r in rows:
        # the pipeline cannot beat one round per block: measured rounds never fall below the ceiling's
        assert r["rounds"] >= r["ceiling_rounds"] >= 3
        assert r["tpf"] <= r["ceiling_tpf"] + 1e-9 <= B + 1e-9
        assert 0.0 <= r["accuracy"] <= 1.0
    assert rows[0]["ceiling_over_d2f"] == rows[0]["ceiling_tpf"] / rows[0]["tpf"]
    assert json.loads(path.read_text())["rows"] == rows
    out = capsys.readouterr().out
    assert "ceil/d2f" in out and "lopa k=2" in out


def test_block_length_override(run_benchmark):
    result = run_benchmark("lopa_ceiling", ["--suite", "arith", "--n", "2", "--branches", "0",
                                            "--block-length", "16", "--set", "skip_threshold=0.9"])
    assert result["block_length"] == 16 and result["overrides"] == {"skip_threshold": 0.9, "block_length": 16}
    assert result["rows"][0]["ceiling_tpf"] <= 16
