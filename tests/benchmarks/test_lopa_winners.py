"""benchmarks/lopa_winners.py: per-round winner counts of LoPA on the bundled block-causal model."""


def test_winner_counts_cover_every_round(capsys, run_benchmark):
    result = run_benchmark("lopa_winners", ["--suite", "arith", "--n", "3", "--branches", "0,2"])
    # k = 0 is plain d2f: the anchor wins every round
    assert set(result[("arith", 0)]) == {0}
    assert sum(result[("arith", 0)].values()) >= 3  # at least one round per problem
    wins = result[("arith", 2)]
    assert set(wins) <= {0, 1, 2} and sum(wins.values()) >= 3
    out = capsys.readouterr().out
    assert "arith" in out and "k=2" in out and "0 = anchor" in out


def test_batched_counts_match_batch_one_and_json(tmp_path, run_benchmark):
    """LoPA is batch-invariant, so the counts do not depend on --batch-size; the JSON holds every run."""
    import json

    args = ["--suite", "arith", "--n", "3", "--branches", "2", "--set", "skip_threshold=0.9"]
    one = run_benchmark("lopa_winners", args)
    path = tmp_path / "w.json"
    three = run_benchmark("lopa_winners", args + ["--batch-size", "3", "--json", str(path)])
    assert three[("arith", 2)] == one[("arith", 2)]
    report = json.loads(path.read_text())
    assert report["skip_threshold"] == 0.9 and report["overrides"] == {"skip_threshold": 0.9}
    [row] = report["rows"]
    assert row["suite"] == "arith" and row["lopa_branches"] == 2
    assert {int(i): c for i, c in row["wins"].items()} == dict(three[("arith", 2)])
    assert sum(row["wins"].values()) == row["rounds"]  # one winner per forward
    assert 0.0 <= row["accuracy"] <= 1.0 and row["tpf"] == row["tokens"] / row["rounds"]
    assert row["lookahead_share"] == 1 - row["wins"].get("0", 0) / row["rounds"]


def test_bad_counts_are_usage_errors(capsys, run_benchmark):
    import pytest

    for bad in (["--batch-size", "0"], ["--n", "0"], ["--branches", "2,x"], ["--branches", "-1"]):
        with pytest.raises(SystemExit) as exc:
            run_benchmark("lopa_winners", ["--suite", "arith", *bad])
        assert exc.value.code == 2
        assert "error:" in capsys.readouterr().err
