"""benchmarks/scaling.py: parameter counts agree with the published sizes, and the layouts' arithmetic."""

import pytest


def test_published_sizes(load_benchmark):
    scaling = load_benchmark("scaling")
    shapes = {name: scaling.Shape.from_config(name, c) for name, c in scaling.MODELS.items()}
    total, active = shapes["LLaDA2.0-flash"].params()
    assert 100e9 < total < 105e9 and 6.0e9 < active < 6.3e9  # "100B total, 6.1B active"
    assert shapes["LLaDA-8B"].params()[0] == pytest.approx(8.02e9, rel=0.005)
    assert shapes["SDAR-8B"].params()[0] == pytest.approx(8.19e9, rel=0.005)


def test_layout_arithmetic(load_benchmark):
    scaling = load_benchmark("scaling")
    llada = scaling.Shape.from_config("LLaDA-8B", scaling.MODELS["LLaDA-8B"])
    assert llada.weights_per_gpu(2) == pytest.approx(llada.weights_per_gpu(1) / 2, rel=0.01)
    assert llada.kv_bytes_per_token(1) == 2 * 32 * 32 * 128 * 2
    # ring all-reduce: 2 (n-1)/n of each of 2 tensors per layer, tokens x hidden x 2 bytes
    assert llada.tp_bytes_per_step(2, tokens=10, scored=0) == 2 * 32 * (2 * 1 / 2) * 10 * 4096 * 2
    flash = scaling.Shape.from_config("flash", scaling.MODELS["LLaDA2.0-flash"])
    assert flash.kv_bytes_per_token(8) == flash.kv_bytes_per_token(4)  # 4 KV heads: one per GPU from TP 4 on
    assert flash.weights_per_gpu(8, expert_parallel=True) > flash.weights_per_gpu(8)  # EP replicates attention


def test_writes_its_report(run_benchmark, tmp_path):
    out = run_benchmark("scaling", ["--json", str(tmp_path / "s.json"), "--rows", "1"])
    assert (tmp_path / "s.json").exists() and out["rows"] == 1 and len(out["models"]) == 3
    flash = next(m for m in out["models"] if m["model"] == "LLaDA2.0-flash")
    assert not next(x for x in flash["layouts"] if x["layout"] == "TP 1")["fits"]
