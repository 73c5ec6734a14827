"""The server on the mixture-of-experts formats: LLaDA2 (block-causal, token editing) and LLaDA-MoE."""

from __future__ import annotations

import httpx
import pytest
import torch

from dllm.serving.testing import TEST_MODEL as MODEL


@pytest.mark.parametrize("family", ["llada2", "llada-moe"])
def test_chat_on_moe_checkpoints(serve, moe_checkpoints, family):
    with serve(moe_checkpoints[family]) as (url, app):
        card = httpx.get(url + "/v1/models").json()["data"][0]
        body = {"model": MODEL, "messages": [{"role": "user", "content": "reverse : Ann Bob"}], "max_tokens": 16}
        if family == "llada2":
            body.update(strategy="edit", editing_threshold=0.5, max_post_steps=4)
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["usage"]["completion_tokens"] >= 1
        bundle = app.state.dllm.bundle
        if family == "llada2":  # the request's decoding is the offline one
            assert bundle.model.spec.block_alignment == "position" and bundle.base_cfg.strategy == "edit"
            ids = bundle.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            cfg = bundle.base_cfg.replace(max_new_tokens=16, editing_threshold=0.5, max_post_steps=4)
            gen = bundle.model.generate(torch.tensor([ids]), generation_config=cfg).sequences[0, len(ids):].tolist()
            eos = bundle.tokenizer.eos_token_id
            gen = gen[: gen.index(eos)] if eos in gen else gen
            assert out["choices"][0]["message"]["content"] == bundle.tokenizer.decode(gen, skip_special_tokens=True)
        else:
            assert card["id"] == MODEL
            bad = httpx.post(url + "/v1/chat/completions", json={**body, "strategy": "edit"}, timeout=60)
            assert bad.status_code == 400 and "block-causal" in bad.text


def test_streamed_edit_deltas_join_to_the_whole_answer(serve, moe_checkpoints):
    """`edit` may rewrite committed tokens of the current block: the stream sends only finished text, so the
    joined SSE deltas are the non-streamed answer for the same body (temperature 0)."""
    import json

    with serve(moe_checkpoints["llada2"]) as (url, _app):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "reverse : Ann Bob Cal"}], "max_tokens": 48,
                "temperature": 0, "strategy": "edit", "editing_threshold": 0.5}
        whole = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        assert whole.status_code == 200, whole.text
        whole = whole.json()
        assert whole["dllm"]["strategy"] == "edit"
        content = whole["choices"][0]["message"]["content"]
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
        deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
        assert content and sum(1 for d in deltas if d) >= 2  # the text came block by block, not all at the end
        assert "".join(deltas) == content
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert finish == [whole["choices"][0]["finish_reason"]]
