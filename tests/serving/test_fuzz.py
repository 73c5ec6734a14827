"""Property-based fuzzing of the request schema: no input makes the server answer 5xx."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dllm.serving.protocol import ChatCompletionRequest, CompletionRequest
from dllm.serving.testing import TEST_MODEL as MODEL

# every field either request model knows, and names it does not (a typo, another server's extension)
FIELDS = sorted(set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)) + [
    "skip_treshold", "guided_whitespace_pattern", "x"]

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.integers(-3, 40)
           | st.floats(allow_nan=False, allow_infinity=False) | st.floats(-1, 3)
           | st.text(max_size=12) | st.sampled_from(["threshold", "d2f", "lopa", "vanilla", "factor", "entropy",
                                                     "d3llm", "dual", "prefix", "none", "random", "neg_entropy", MODEL, "hi"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "developer", "x"]),
                                           "content": st.text(max_size=20) | json_values}), max_size=3)
prompts = (st.text(max_size=30) | st.lists(st.text(max_size=10), max_size=3)
           | st.lists(st.integers(-5, 200), max_size=6) | st.lists(st.lists(st.integers(0, 120), max_size=4), max_size=3))
special = {"messages": messages | json_values, "prompt": prompts | json_values,
           "model": st.just(MODEL) | st.text(max_size=8) | json_values,
           "max_tokens": st.integers(-2, 40) | json_values}
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8).flatmap(
    lambda d: st.fixed_dictionaries({k: special.get(k, json_values) for k in d} if d else {}))
plausible = st.fixed_dictionaries(
    {"model": st.just(MODEL), "prompt": prompts, "messages": messages},
    optional={k: special.get(k, json_values) for k in FIELDS if k not in ("model", "prompt", "messages")})

unit = st.floats(0, 1)
in_range = {  # values that mostly pass validation, so decoding itself gets fuzzed too
    "strategy": st.sampled_from(["threshold", "vanilla", "factor", "entropy", "margin", "maskgit_plus", "d3llm",
                                 "lopa", "d2f"]),
    "threshold": unit, "skip_threshold": unit, "block_add_threshold": unit, "decoded_token_threshold": unit,
    "entropy_threshold": st.floats(0, 5), "factor": st.floats(0.01, 4), "cache": st.sampled_from(["none", "prefix", "dual"]),
    "block_length": st.sampled_from([1, 2, 3, 4, 8, 16]), "steps": st.integers(1, 16), "lopa_branches": st.integers(0, 4),
    "lopa_alpha": unit, "lopa_rho": st.floats(0.01, 1), "lopa_confidence": st.sampled_from(["prob", "neg_entropy"]),
    "remasking": st.sampled_from(["low_confidence", "random"]), "refresh_interval": st.integers(1, 4),
    "cache_delay": st.integers(0, 4), "d2f_confidence": st.sampled_from(["prob", "neg_entropy", "margin"]),
    "min_p": st.floats(0, 0.99), "min_tokens": st.integers(0, 4), "ignore_eos": st.booleans(),
    "top_k": st.integers(1, 500), "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "n": st.integers(1, 3),
    "seed": st.integers(0, 2**64 - 1), "max_tokens": st.integers(1, 16), "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "echo": st.booleans(),
}
sane = st.fixed_dictionaries({"model": st.just(MODEL), "prompt": st.text(min_size=1, max_size=20),
                              "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"),
                                                                          "content": st.text(max_size=20)}),
                                                   min_size=1, max_size=2)},
                             optional=in_range)


@pytest.fixture(scope="module")
def client(serve, checkpoint):
    # small caps keep every accepted request cheap
    with serve(checkpoint, max_tokens_cap=16, max_n=4, max_rows_per_request=8, max_body_bytes=4096) as (url, _app), \
            httpx.Client(base_url=url, timeout=60) as c:
        yield c


# DLLM_FUZZ_EXAMPLES=5000 for a long run (the default keeps the suite short)
FUZZ = settings(max_examples=int(os.environ.get("DLLM_FUZZ_EXAMPLES", "300")), deadline=None,
                suppress_health_check=list(HealthCheck))


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = [line for line in r.text.split("\n\n") if line]
        assert events[-1] == "data: [DONE]"
        for e in events[:-1]:
            payload = json.loads(e[len("data: "):])
            # an error found only once decoding ran arrives in the stream; it must still be the user's error
            assert payload.get("error", {}).get("type", "invalid_request_error") == "invalid_request_error", e


@FUZZ
@given(body=bodies | plausible | sane, chat=st.booleans())
def test_fuzzed_bodies_never_5xx(client, body, chat):
    _check(client.post("/v1/chat/completions" if chat else "/v1/completions", json=body))


@FUZZ
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode), chat=st.booleans())
def test_fuzzed_raw_bytes_never_5xx(client, raw, chat):
    r = client.post("/v1/chat/completions" if chat else "/v1/completions", content=raw,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("field", ["temperature", "threshold", "factor", "entropy_threshold", "top_p", "min_p",
                                   "lopa_alpha", "max_tokens", "n", "seed"])
@pytest.mark.parametrize("number", ["1e999", "-1e999", "NaN", "Infinity"])
def test_non_finite_numbers_are_400_naming_the_field(client, field, number):
    """JSON has no NaN or Infinity, and 1e999 parses to infinity: each is refused before any work runs."""
    raw = f'{{"model": "{MODEL}", "prompt": "hi", "max_tokens": 4, "{field}": {number}}}'
    r = client.post("/v1/completions", content=raw.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "invalid_json" or err["param"] == field, err
