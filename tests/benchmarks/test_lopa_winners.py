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
