"""benchmarks/cache_list_failures.py: list accuracy per cache mode, and failures that repeat a name."""

import json

import pytest


def test_counts_are_consistent_and_no_cache_keeps_shuffle(run_benchmark, tmp_path):
    out = tmp_path / "r.json"
    result = run_benchmark("cache_list_failures", ["--ops", "shuffle,copy", "--caches", "none,dual", "--n", "4",
                                                   "--json", str(out)])
    assert json.loads(out.read_text()) == result
    rows = {(r["op"], r["cache"]): r for r in result["rows"]}
    assert set(rows) == {("shuffle", "none"), ("shuffle", "dual"), ("copy", "none"), ("copy", "dual")}
    for r in rows.values():
        assert r["n"] == 4 and r["correct"] + r["failures"] == 4
        assert 0 <= r["failures_repeating_a_name"] <= r["failures"]
    # the bundled tiny solves shuffle without a cache; the dual cache's failures repeat a name
    assert rows["shuffle", "none"]["correct"] >= 3
    assert rows["shuffle", "dual"]["failures_repeating_a_name"] == rows["shuffle", "dual"]["failures"]


def test_has_repeat(load_benchmark):
    mod = load_benchmark("cache_list_failures")
    assert mod.has_repeat(["Hal", "Lee", "Hal"]) and not mod.has_repeat(["Hal", "Lee"])


def test_bad_input_is_a_clear_error(run_benchmark):
    with pytest.raises(SystemExit, match="valid ops"):
        run_benchmark("cache_list_failures", ["--ops", "spin"])
    with pytest.raises(SystemExit, match="unknown cache"):
        run_benchmark("cache_list_failures", ["--caches", "paged"])
    with pytest.raises(SystemExit, match="at least 1"):
        run_benchmark("cache_list_failures", ["--n", "0"])
