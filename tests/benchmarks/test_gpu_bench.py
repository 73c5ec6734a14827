"""benchmarks/gpu_bench.py --dry: the GPU benchmark runs end to end on CPU with tiny shapes."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"


def _run(tmp_path, *args, timeout=180):
    out = tmp_path / "bench.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("DLLM_ATTN_BACKEND", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--json", str(out), *args], cwd=ROOT, env=env,
                          check=False, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("dry"))


@pytest.mark.slow
def test_dry_run_prints_one_table(dry):
    stdout, data = dry
    lines = stdout.splitlines()
    assert lines[0].startswith("# dllm GPU hot paths") and "DRY" in lines[0]
    assert lines[1].split()[:6] == ["section", "case", "variant", "ms", "speedup", "tok/s"]
    assert sum(1 for line in lines if line.startswith("section ")) == 1  # one table
    assert lines[-1].startswith("# sections: ")  # in order, and --dry leaves out the tests section
    assert re.findall(r"(\w+) ok \(", lines[-1]) == ["confidence", "e2e", "attention", "compile"]
    assert data["meta"]["dry"] and data["meta"]["total_s"] < 60
    assert {s["status"] for s in data["sections"].values()} == {"ok"}
    for r in data["rows"]:  # every row appears in the printed table
        assert any(line.startswith(r["section"]) and r["case"] in line and r["variant"] in line for line in lines)


def test_dry_attention_rows_cover_every_cache_mode_and_backend(dry):
    _, data = dry
    rows = [r for r in data["rows"] if r["section"] == "attention"]
    modes = ["none (full canvas)", "prefix", "dual (replace)", "d2f exact cache", "lopa 2+1 branches"]
    for batch in (1, 2):
        for mode in modes:
            got = {r["variant"]: r for r in rows if r["case"].startswith(f"{mode} b={batch} ")}
            assert set(got) == {"sdpa", "flex"}, (mode, batch)
            assert all(math.isfinite(r["ms"]) and r["ms"] > 0 for r in got.values())
            assert got["flex"]["speedup"] is not None and got["sdpa"]["speedup"] is None
            diff = float(got["flex"]["note"].split("max|diff| vs sdpa ")[1])
            assert diff < 1e-5  # fp32: the two backends compute the same attention


def test_dry_e2e_rows(dry):
    """Every family and strategy at both batches; each forward commits --tpf (4) tokens per row, so a row of 32
    tokens takes 8 forwards; the first two cases at batch 1 also run on flex, token for token the same."""
    _, data = dry
    rows = {(r["case"], r["variant"]): r for r in data["rows"] if r["section"] == "e2e"}
    llada = ["threshold+dual", "d2f", "vanilla", "threshold", "threshold+prefix", "lopa k=2"]
    cases = [f"llada-dry {s}" for s in llada] + ["sdar-dry sdar", "dream-dry threshold+dual"]
    for batch in (1, 2):
        for case in cases:
            r = rows[f"{case} b={batch}", "sdpa"]
            assert r["tokens_per_s"] > 0 and r["extra"]["tokens"] == 32 * batch  # max_new_tokens=32, no EOS stop
            assert r["extra"]["ms_per_forward"] > 0 and 0 < r["extra"]["forward_share"] <= 1
            assert r["extra"]["host_reads_per_forward"] > 0 and "host reads/forward" in r["note"]
            if case.endswith(("threshold+dual", "d2f")):  # docs/kernels.md, "Host synchronisations"
                assert r["extra"]["host_reads_per_forward"] < 5, case
            if case.startswith("llada") or batch == 1:  # SDAR's own blocks: padded rows start mid-block
                assert r["extra"]["tpf"] == 4.0 and r["extra"]["forwards"] == [8] * batch, case
    flex = {case for case, variant in rows if variant == "flex"}
    assert flex == {"llada-dry threshold+dual b=1", "llada-dry d2f b=1"}
    assert all(rows[case, "flex"]["extra"]["same_tokens_as_first_backend"] is True for case in flex)
    assert set(data["meta"]["models"]) == {"llada-dry", "sdar-dry", "dream-dry"}


def test_dry_compile_rows(dry):
    _, data = dry
    rows = {(r["case"], r["variant"]): r for r in data["rows"] if r["section"] == "compile"}
    assert set(rows) == {(f"llada-dry {s} b=1", v) for s in ("threshold+dual", "d2f") for v in ("eager", "compile")}
    for (_case, variant), r in rows.items():
        assert r["tokens_per_s"] > 0
        if variant == "compile":
            assert r["extra"]["same_tokens_as_eager"] is True and r["extra"]["backend"] == "eager"


def test_dry_confidence_rows(dry):
    _, data = dry
    rows = [r for r in data["rows"] if r["section"] == "confidence"]
    try:
        import dllm.decoding.kernels.confidence  # noqa: F401
    except ImportError:
        assert rows and rows[0]["note"].startswith("skipped")
        return
    for n in (4, 16):
        got = {r["variant"]: r for r in rows if r["case"].startswith(f"N={n} ")}
        assert set(got) == {"pytorch", "kernel"}
        assert got["pytorch"]["ms"] > 0 and "floor" in got["pytorch"]["note"]
        assert got["pytorch"]["extra"]["floor_ms"] > 0


@pytest.mark.slow
def test_failures_and_the_budget_do_not_lose_the_rest(tmp_path):
    stdout, data = _run(tmp_path, "--sections", "bogus,e2e", "--backends", "sdpa,nope")
    e2e = [r for r in data["rows"] if r["section"] == "e2e"]
    assert [r["note"].startswith("error") for r in e2e if r["variant"] == "nope"] == [True, True]
    assert all(r["tokens_per_s"] > 0 for r in e2e if r["variant"] == "sdpa") and len(e2e) == 18
    assert data["sections"]["bogus"]["status"] == "error" and data["sections"]["e2e"]["status"] == "ok"
    stdout, data = _run(tmp_path, "--budget", "0")
    assert {s["status"] for s in data["sections"].values()} == {"timeout"}
    assert "section stopped" in stdout


def test_the_tests_section_reports_the_pytest_summary(tmp_path):
    stdout, data = _run(tmp_path, "--sections", "tests", "--test-paths", "tests/benchmarks/test_lopa_ceiling.py")
    [r] = data["rows"]
    assert r["case"] == "pytest -m gpu tests/benchmarks/test_lopa_ceiling.py" and "deselected" in r["note"]
    assert r["extra"]["returncode"] == 5 and data["sections"]["tests"]["status"] == "ok"
