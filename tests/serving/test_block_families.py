"""`dllm serve` takes the block-diffusion families by path: the families' own decoders by default, streamed
text equal to the whole answer, the family in /v1/models, and a refusal with a reason for a strategy the
model cannot run (checked in the API process, which holds no weights)."""

from __future__ import annotations

import httpx
import pytest

from dllm.serving.testing import TEST_MODEL as MODEL
from dllm.testing import save_tiny_block_checkpoint


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for family in ("sdar", "fast-dllm-v2"):
        d = tmp_path_factory.mktemp(family)
        save_tiny_block_checkpoint(d, family, seed=0, scale=8.0, silent=(2, 3))
        out[family] = d
    return out


@pytest.mark.slow  # four live servers (two with an engine process): ~40 s on 2 cores
@pytest.mark.parametrize("family,strategy", [("sdar", "sdar"), ("fast-dllm-v2", "fast_dllm_v2")])
@pytest.mark.parametrize("engine_process", [False, True])
def test_serve_decodes_with_the_family_decoder(serve, checkpoints, family, strategy, engine_process):
    with serve(checkpoints[family], engine_process=engine_process) as (url, _):
        info = httpx.get(url + "/v1/models").json()["data"][0]["dllm"]
        assert info["default_strategy"] == strategy and info["attention"] == "block_causal"
        body = {"model": MODEL, "prompt": "sort : Ann Bob", "max_tokens": 12, "temperature": 0}
        whole = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert whole["dllm"]["strategy"] == strategy and whole["usage"]["completion_tokens"] == 12
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            chunks = [line for line in r.iter_lines() if line.startswith("data: {")]
        import json

        text = "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks)
        assert text == whole["choices"][0]["text"]
        if family == "sdar":  # a strategy that needs shifted logits: refused with the reason, not a 500
            bad = httpx.post(url + "/v1/completions", json={**body, "strategy": "fast_dllm_v2"}, timeout=60)
            assert bad.status_code == 400 and "shifted logits" in bad.text


def test_serve_takes_sdar_moe_with_its_family_decoder(serve, tmp_path):
    """SDAR's mixture-of-experts format serves as dense SDAR does (its decoder by default)."""
    from dllm.testing import save_tiny_moe_checkpoint

    save_tiny_moe_checkpoint(tmp_path / "sdar-moe", "sdar-moe", seed=0, scale=2.0)
    with serve(tmp_path / "sdar-moe") as (url, _):
        info = httpx.get(url + "/v1/models").json()["data"][0]["dllm"]
        assert info["default_strategy"] == "sdar" and info["attention"] == "block_causal"
        body = {"model": MODEL, "prompt": "sort : Ann Bob", "max_tokens": 8, "temperature": 0}
        whole = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert whole["dllm"]["strategy"] == "sdar" and whole["usage"]["completion_tokens"] == 8
