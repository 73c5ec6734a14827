"""The `dllm` command on a block-diffusion checkpoint: a folder in SDAR's published layout (no dllm decoding
defaults) generates and benchmarks with its family's decoder, `sdar`, as the default."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dllm.testing import save_tiny_block_checkpoint

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def sdar_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sdar")
    save_tiny_block_checkpoint(d, "sdar", scale=8.0)  # SDAR-4B-Chat's layout at a tiny size: blocks of 4
    assert "dllm" not in json.loads((d / "generation_config.json").read_text())
    return d


def _dllm(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("dllm", path=str(BIN))
    assert exe, "the dllm command is installed beside this python"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([exe, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"dllm {' '.join(args)}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    return run


def test_generate_uses_the_family_decoder_by_default(sdar_dir, tmp_path):
    run = _dllm("generate", "reverse : Ann Bob", "--model", str(sdar_dir), "--max-new-tokens", "12", "--json",
                cwd=tmp_path)
    payload = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))
    assert payload["strategy"] == "sdar"
    assert payload["generated_tokens"] >= 1 and payload["num_forwards"] >= 1
    assert payload["tpf"] == pytest.approx(payload["generated_tokens"] / payload["num_forwards"], abs=1e-3)


def test_bench_runs_sdar_beside_threshold(sdar_dir, tmp_path):
    report = tmp_path / "bench.json"
    run = _dllm("bench", "--model", str(sdar_dir), "--n", "1", "--suite", "arith", "--strategies", "sdar,threshold",
                "--threads", "1", "--no-progress", "--json", str(report), cwd=tmp_path)
    rows = json.loads(report.read_text())["results"]
    assert [r["strategy"] for r in rows] == ["sdar", "threshold"]
    assert rows[0]["speedup"] == 1.0  # the first strategy is the baseline
    assert all(r["examples"] == 1 and r["forwards"] >= 1 for r in rows)
    table = [line.split()[0] for line in run.stdout.splitlines() if line.split()[:1] in (["sdar"], ["threshold"])]
    assert table == ["sdar", "threshold"]
    assert f"model={sdar_dir}" in run.stdout and "suite=arith n=1/suite" in run.stdout


def test_info_reports_sdar_as_the_default(sdar_dir, tmp_path):
    run = _dllm("info", str(sdar_dir), cwd=tmp_path)
    fields = dict(line.split(None, 1) for line in run.stdout.splitlines() if len(line.split(None, 1)) == 2)
    assert fields["family"] == "SDAR" and fields["attention"] == "block_causal"
    assert fields["generation_defaults"].startswith("strategy=sdar,") and "block_length=4" in fields["generation_defaults"]
