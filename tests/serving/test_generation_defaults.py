"""``dllm serve --set KEY=VALUE``: server-wide generation defaults over the checkpoint's, which a
request's own fields still override; in the decoding thread and in the engine process."""

from __future__ import annotations

import httpx
import pytest

from dllm.serving.settings import ServerSettings
from dllm.serving.testing import TEST_MODEL as MODEL


def _settings_echo(url: str, **extra) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 16,
                                                 "temperature": 0, **extra}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["dllm"]["settings"]


@pytest.mark.parametrize("engine_process", [False, True], ids=["thread", "engine-process"])
@pytest.mark.slow
def test_defaults_apply_and_requests_override_them(serve, checkpoint, engine_process):
    with serve(checkpoint, engine_process=engine_process,
               generation_defaults={"threshold": 0.05, "cache": "dual"}) as (url, _app):
        plain = _settings_echo(url)
        assert plain["threshold"] == 0.05 and plain["cache"] == "dual"
        own = _settings_echo(url, threshold=1.0)
        assert own["threshold"] == 1.0 and own["cache"] == "dual"


def test_unknown_names_fail_at_settings_time():
    with pytest.raises(ValueError, match="unknown generation option.*treshold.*valid: "):
        ServerSettings(generation_defaults={"treshold": 0.5})
