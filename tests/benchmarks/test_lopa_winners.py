"""benchmarks/lopa_winners.py: per-round winner counts of LoPA on the bundled block-causal model."""

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lopa_winners.py"


def _load():
    spec = importlib.util.spec_from_file_location("lopa_winners", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_winner_counts_cover_every_round(capsys):
    threads = torch.get_num_threads()
    try:
        result = _load().main(["--suite", "arith", "--n", "3", "--branches", "0,2"])
    finally:
        torch.set_num_threads(threads)
    # k = 0 is plain d2f: the anchor wins every round
    assert set(result[("arith", 0)]) == {0}
    assert sum(result[("arith", 0)].values()) >= 3  # at least one round per problem
    wins = result[("arith", 2)]
    assert set(wins) <= {0, 1, 2} and sum(wins.values()) >= 3
    out = capsys.readouterr().out
    assert "arith" in out and "k=2" in out and "0 = anchor" in out
