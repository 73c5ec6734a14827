"""benchmarks/overhead.py: the forward share, per-step overhead and host reads of every strategy."""

import json

import pytest


@pytest.mark.slow
def test_every_strategy_gets_a_row_with_its_host_reads(tmp_path, capsys, run_benchmark):
    path = tmp_path / "overhead.json"
    run_benchmark("overhead", ["--new-tokens", "16", "--repeats", "1", "--threads", "1", "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    assert [r["strategy"] for r in rows][:4] == ["vanilla", "threshold", "threshold+prefix", "threshold+dual"]
    for r in rows:
        assert 0 < r["forward_share"] <= 1 and r["forwards"] > 0 and r["host_reads_per_forward"] > 0
    assert "host reads/fwd" in capsys.readouterr().out
