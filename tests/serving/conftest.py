"""Live servers for the serving tests: a tiny random checkpoint, uvicorn in a thread, loopback only."""

from __future__ import annotations

import contextlib
import time

import httpx
import pytest
import torch

from dllm.serving.app import create_app
from dllm.serving.settings import ServerSettings
from dllm.serving.state import load_bundle
from dllm.serving.testing import TEST_MODEL as MODEL
from dllm.serving.testing import build_checkpoint, running_server


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("serving-ckpt"))


@pytest.fixture(scope="module")
def one_thread():
    # One intra-op thread: the tests share 2 CPUs with other work, and OpenMP spin-waiting under
    # contention makes every tiny matmul ~100x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def serve(one_thread):
    """``with serve(checkpoint, **settings) as (url, app):`` runs a live server."""

    @contextlib.contextmanager
    def _serve(path, engine_process: bool = False, **overrides):
        if engine_process:  # the model loads in the engine process; wait for /ready
            settings = ServerSettings(model=str(path), served_model_name=MODEL, engine_process=True, num_threads=1,
                                      **overrides)
            app = create_app(settings)
            with running_server(app) as url:
                deadline = time.monotonic() + 90
                while httpx.get(url + "/ready").status_code != 200:
                    assert time.monotonic() < deadline, httpx.get(url + "/ready").text
                    time.sleep(0.05)
                yield url, app
            return
        settings = ServerSettings(model=str(path), served_model_name=MODEL, **overrides)
        bundle = load_bundle(settings)
        app = create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer)
        with running_server(app) as url:
            yield url, app

    return _serve
