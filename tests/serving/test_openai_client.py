"""The official ``openai`` client against a live server: completions, chat, streaming, n, stop, seed, errors."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from dllm.serving.testing import TEST_MODEL as MODEL
from dllm.serving.testing import build_checkpoint

PROMPTS = ["the cat sat on the mat", "what is two plus three", "sort the list : red blue green", "hello world"]


@pytest.fixture(scope="module")
def server(serve, checkpoint):
    with serve(checkpoint, max_tokens_cap=128) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def bc_server(serve, tmp_path_factory):
    path = build_checkpoint(tmp_path_factory.mktemp("bc"), block_causal=True, seed=3)
    with serve(path) as (url, app):
        yield url, app


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)


def _offline_text(app, prompt_ids: list[int], max_tokens: int, **overrides) -> tuple[str, str]:
    """What ``generate`` gives for one prompt, capped like the server caps (text, finish_reason)."""
    bundle = app.state.dllm.bundle
    cfg = bundle.base_cfg
    block = overrides.get("block_length", cfg.block_length)
    canvas = -(-max_tokens // block) * block
    out = bundle.model.generate(torch.tensor([prompt_ids]), generation_config=cfg,
                                **{"max_new_tokens": canvas, **overrides})
    ids = out.sequences[0, len(prompt_ids):].tolist()
    eos = bundle.tokenizer.eos_token_id
    ended = eos in ids[:max_tokens]
    if eos in ids:
        ids = ids[: ids.index(eos)]
    ids = ids[:max_tokens]
    return bundle.tokenizer.decode(ids, skip_special_tokens=True), ("stop" if ended else "length")


def _chat_ids(app, content: str) -> list[int]:
    tok = app.state.dllm.bundle.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL
    cfg = server[1].state.dllm.bundle.model.config
    assert card.model_extra["max_model_len"] == cfg.max_sequence_length
    facts = card.model_extra["dllm"]
    assert facts["family"] == "llada" and facts["architecture"] == "LLaDAModelLM" and facts["logits"] == "aligned"
    assert facts["attention"] in ("bidirectional", "block_causal") and facts["default_strategy"]
    assert (facts["block_size"] is None) == (facts["attention"] == "bidirectional")
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    assert httpx.get(server[0] + "/ready").status_code == 200


def test_completion_equals_offline_generate(server, client):
    _url, app = server
    tok = app.state.dllm.bundle.tokenizer
    for prompt in PROMPTS[:2]:
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
        ids = tok(prompt)["input_ids"]
        text, reason = _offline_text(app, ids, 12)
        assert r.object == "text_completion" and isinstance(r.created, int)
        assert r.choices[0].text == text and r.choices[0].finish_reason == reason
        assert r.usage.prompt_tokens == len(ids)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        dllm = r.model_extra["dllm"]
        assert dllm["strategy"] == "threshold" and dllm["num_forwards"] >= 1
        assert dllm["tpf"] == pytest.approx(r.usage.completion_tokens / dllm["num_forwards"], abs=1e-3)


def test_chat_equals_offline_generate(server, client):
    _url, app = server
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[2]}],
                                       max_completion_tokens=20, temperature=0)
    text, reason = _offline_text(app, _chat_ids(app, PROMPTS[2]), 20)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == text
    assert r.choices[0].finish_reason == reason


def _stream_chat(client, **kw):
    chunks = list(client.chat.completions.create(model=MODEL, stream=True, **kw))
    texts, reasons, roles = {}, {}, {}
    for c in chunks:
        for ch in c.choices:
            if ch.delta.role:
                roles[ch.index] = ch.delta.role
            if ch.delta.content:
                texts.setdefault(ch.index, []).append(ch.delta.content)
            if ch.finish_reason:
                reasons[ch.index] = ch.finish_reason
    return chunks, texts, reasons, roles


@pytest.mark.parametrize("which", ["bidirectional", "block_causal"])
def test_streamed_deltas_concatenate_to_non_streamed_text(which, server, bc_server):
    url, app = server if which == "bidirectional" else bc_server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    block = app.state.dllm.bundle.base_cfg.block_length
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0)
        chunks, texts, reasons, roles = _stream_chat(client, messages=messages, max_tokens=32, temperature=0,
                                                     stream_options={"include_usage": True})
        assert roles == {0: "assistant"}
        assert "".join(texts.get(0, [])) == full.choices[0].message.content
        assert reasons == {0: full.choices[0].finish_reason}
        assert len({c.id for c in chunks}) == 1 and chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
        assert chunks[-1].model_extra["dllm"]["num_forwards"] == full.model_extra["dllm"]["num_forwards"]
        # streamed in pieces as blocks commit (the server merges steps only when the client lags behind)
        if full.usage.completion_tokens > 2 * block:
            assert len(texts[0]) > 1
        # completions endpoint: same property
        done = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        parts = [c.choices[0].text for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                                                      temperature=0, stream=True) if c.choices]
        assert "".join(parts) == done.choices[0].text


def test_n_choices(client):
    r = client.completions.create(model=MODEL, prompt=["hello world", "the cat"], n=2, max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text == r.choices[1].text and r.choices[2].text == r.choices[3].text  # greedy
    _chunks, texts, reasons, roles = _stream_chat(client, messages=[{"role": "user", "content": "hello"}], n=3,
                                                 max_tokens=8, temperature=0)
    assert set(roles) == {0, 1, 2} and set(reasons) == {0, 1, 2}
    assert len({"".join(t) for t in texts.values()}) == 1


def test_stop_strings_cut_text_even_across_chunks(client):
    messages = [{"role": "user", "content": PROMPTS[0]}]
    # The server merges a choice's deltas that are ready at one wake-up, so on a loaded machine a
    # stream can arrive in fewer chunks; the property needs one chunk boundary, so ask again if not.
    for _attempt in range(5):
        _, texts, _, _ = _stream_chat(client, messages=messages, max_tokens=32, temperature=0)
        deltas = texts[0]
        if len(deltas) >= 2:
            break
    full = "".join(deltas)
    assert len(deltas) >= 2, deltas
    # a stop string straddling the boundary between two deltas
    k = next(i for i in range(1, len(deltas)) if len(deltas[i - 1]) >= 1 and len(deltas[i]) >= 1)
    stop = deltas[k - 1][-1] + deltas[k][:2]
    expected = full[: full.index(stop)]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0, stop=[stop, "@@@"])
    assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
    _, texts2, reasons2, _ = _stream_chat(client, messages=messages, max_tokens=32, temperature=0, stop=stop)
    assert "".join(texts2.get(0, [])) == expected and reasons2 == {0: "stop"}
    # a stop string that never occurs changes nothing
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32, temperature=0, stop="zzzz")
    assert r.choices[0].message.content == full


def test_seed_makes_sampling_reproducible(client):
    kw = {"model": MODEL, "prompt": "the dog ran", "max_tokens": 24, "temperature": 1.0}
    a = client.completions.create(seed=7, n=2, **kw)
    b = client.completions.create(seed=7, n=2, **kw)
    c = client.completions.create(seed=8, n=2, **kw)
    assert [x.text for x in a.choices] == [x.text for x in b.choices]
    assert [x.text for x in a.choices] != [x.text for x in c.choices]
    assert a.choices[0].text != a.choices[1].text  # n samples are independent


def test_diffusion_extras_take_effect(client):
    slow = client.completions.create(model=MODEL, prompt="hello", max_tokens=16, temperature=0,
                                     extra_body={"threshold": 1.0})
    fast = client.completions.create(model=MODEL, prompt="hello", max_tokens=16, temperature=0,
                                     extra_body={"threshold": 0.05, "block_length": 16, "cache": "dual"})
    s, f = slow.model_extra["dllm"], fast.model_extra["dllm"]
    assert s["settings"]["threshold"] == 1.0 and f["settings"]["block_length"] == 16 and f["settings"]["cache"] == "dual"
    assert f["num_forwards"] < s["num_forwards"]


def test_token_prompts_echo_and_caps(server, client):
    tok = server[1].state.dllm.bundle.tokenizer
    ids = tok("the cat sat")["input_ids"]
    a = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    b = client.completions.create(model=MODEL, prompt="the cat sat", max_tokens=8, temperature=0, echo=True)
    assert b.choices[0].text == "the cat sat" + a.choices[0].text
    c = client.completions.create(model=MODEL, prompt=[ids, ids[:2]], max_tokens=3, temperature=0,
                                  extra_body={"threshold": 1.0})
    assert c.choices[0].text == client.completions.create(model=MODEL, prompt=ids, max_tokens=3, temperature=0,
                                                          extra_body={"threshold": 1.0}).choices[0].text
    for ch in c.choices:
        assert ch.finish_reason in ("stop", "length")
    assert c.usage.completion_tokens <= 2 * (3 + 1)


def _error(fn):
    with pytest.raises(openai.APIStatusError) as info:
        fn()
    err = info.value
    assert set(err.body) >= {"message", "type", "param", "code"}, err.body
    assert err.response.headers.get("x-should-retry") == "false"
    return err


def test_typed_errors(client):
    def comp(**kw):
        return lambda: client.completions.create(**{"model": MODEL, "prompt": "hi", "max_tokens": 4, **kw})

    assert isinstance(_error(comp(model="nope")), openai.NotFoundError)
    for kw, param in [({"temperature": 5}, "temperature"), ({"n": 0}, "n"), ({"max_tokens": 100000}, "max_tokens"),
                      ({"extra_body": {"strategy": "warp"}}, "strategy"), ({"extra_body": {"threshold": 2}}, "threshold"),
                      ({"extra_body": {"strategy": "d2f"}}, "strategy"), ({"extra_body": {"block_length": 0}}, "block_length"),
                      ({"logprobs": 2}, "logprobs"), ({"prompt": []}, "prompt"), ({"prompt": [10**9]}, "prompt"),
                      ({"stop": ["x"] * 50}, "stop"), ({"presence_penalty": 1.0}, "presence_penalty")]:
        err = _error(comp(**kw))
        assert isinstance(err, openai.BadRequestError), (kw, err)
        assert err.body["param"] == param, (kw, err.body)
    big = _error(comp(prompt="hello " * 5000))
    assert big.status_code == 413 and big.body["code"] == "prompt_too_long"
    chat = _error(lambda: client.chat.completions.create(model=MODEL, messages=[], max_tokens=4))
    assert isinstance(chat, openai.BadRequestError) and chat.body["param"] == "messages"


def test_unknown_fields_are_refused_by_name(client):
    """A typo never falls back to a default silently: 400, the field named, a close known name suggested."""
    err = _error(lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=4,
                                                   extra_body={"skip_treshold": 0.9, "no_such_option": 1}))
    assert isinstance(err, openai.BadRequestError) and err.body["code"] == "unknown_parameter"
    assert err.body["param"] == "skip_treshold"
    assert "skip_treshold (did you mean skip_threshold?)" in err.body["message"] and "no_such_option" in err.body["message"]
    chat = _error(lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                         max_tokens=4, extra_body={"temprature": 0}))
    assert chat.body["param"] == "temprature" and "did you mean temperature?" in chat.body["message"]


def test_knobs_the_strategy_does_not_read_are_refused_by_name(client):
    """A knob that would change nothing under the request's strategy is a 400 naming it and its readers."""
    err = _error(lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=4,
                                                   extra_body={"strategy": "vanilla", "lopa_branches": 2}))
    assert isinstance(err, openai.BadRequestError) and err.body["param"] == "lopa_branches"
    assert "strategy 'vanilla' does not read lopa_branches (read by lopa)" in err.body["message"]
    ok = client.completions.create(model=MODEL, prompt="hi", max_tokens=4,
                                   extra_body={"strategy": "vanilla", "steps": 4, "block_length": 4})
    assert ok.choices


@pytest.mark.parametrize("extra,param", [
    ({"repetition_penalty": 1.2}, "repetition_penalty"), ({"guided_json": {"type": "object"}}, "guided_json"),
    ({"guided_choice": ["a", "b"]}, "guided_choice"), ({"store": True}, "store"), ({"metadata": {"k": "v"}}, "metadata"),
    ({"skip_special_tokens": False}, "skip_special_tokens"),
])
def test_known_fields_that_cannot_be_honoured_are_refused(client, extra, param):
    err = _error(lambda: client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body=extra))
    assert isinstance(err, openai.BadRequestError) and err.body["param"] == param
    assert err.body["code"] == "unsupported_parameter"


def test_vllm_sampling_extras_are_honoured(client):
    base = {"model": MODEL, "prompt": "hello", "max_tokens": 8, "temperature": 0}
    filled = client.completions.create(**base, extra_body={"ignore_eos": True, "block_length": 8})
    assert filled.usage.completion_tokens == 8 and filled.choices[0].finish_reason == "length"
    assert filled.model_extra["dllm"]["settings"]["ignore_eos"] is True
    late = client.completions.create(**base, extra_body={"min_tokens": 8, "min_p": 0.1, "block_length": 8})
    assert late.usage.completion_tokens == 8
    err = _error(lambda: client.completions.create(**base, extra_body={"min_tokens": 9}))
    assert err.body["param"] == "min_tokens"


def test_fields_at_values_that_change_nothing_are_accepted(client):
    r = client.completions.create(model=MODEL, prompt="hi", max_tokens=4, temperature=0, user="u-1",
                                  extra_body={"repetition_penalty": 1.0, "store": False, "skip_special_tokens": True})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_raw_http_errors(server):
    url = server[0]
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert r.headers["x-should-retry"] == "false"
    assert httpx.post(url + "/v1/completions", json=[1, 2]).status_code == 400
    assert httpx.post(url + "/v1/completions", content=b'{"model": NaN}').status_code == 400
    r = httpx.post(url + "/v1/completions", content=b"x" * (2 << 20))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(url + "/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "user": "u",
                                                  "stream_options": None})
    assert r.status_code == 200
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "some_future_field": {"a": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "some_future_field"


def test_metrics(server, client):
    client.completions.create(model=MODEL, prompt="hello", max_tokens=4)
    text = httpx.get(server[0] + "/metrics").text
    for name in ("dllm_requests_total", "dllm_request_errors_total", "dllm_request_latency_seconds_bucket",
                 "dllm_time_to_first_token_seconds_bucket", "dllm_forwards_per_request_bucket",
                 "dllm_tokens_per_forward_bucket", "dllm_batch_size_bucket", "dllm_queue_depth",
                 "dllm_running_rows", "dllm_active_branches"):
        assert name in text, name


def test_api_key(serve, checkpoint):
    with serve(checkpoint, api_key="sekret") as (url, _app):
        bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert info.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}).status_code == 401
        good = openai.OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices
        assert httpx.get(url + "/health").status_code == 200


@pytest.mark.parametrize("strategy", ["lopa", "d3llm"])
def test_other_strategies_stream_like_they_answer(bc_server, strategy):
    client = openai.OpenAI(base_url=bc_server[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    extra = {"strategy": strategy, **({"lopa_branches": 2} if strategy == "lopa" else {"entropy_threshold": 2.0})}
    kw = {"messages": [{"role": "user", "content": "hello world"}], "max_tokens": 24, "temperature": 0,
          "extra_body": extra}
    full = client.chat.completions.create(model=MODEL, **kw)
    _, texts, reasons, _ = _stream_chat(client, **kw)
    assert "".join(texts.get(0, [])) == full.choices[0].message.content
    assert reasons == {0: full.choices[0].finish_reason}
    assert full.model_extra["dllm"]["strategy"] == strategy
