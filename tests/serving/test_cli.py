"""``dllm serve``: mounted on the dllm CLI, clear startup errors, a real server process (branch-parallel)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch
from typer.testing import CliRunner

from dllm.serving.testing import build_checkpoint, free_socket


def free_port() -> int:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("cli"), seed=1)


def _app():
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    return app


def test_serve_is_mounted_with_its_options():
    r = CliRunner().invoke(_app(), ["serve", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for flag in ("--model", "--host", "--port", "--api-key", "--max-batch-size", "--max-queue", "--branch-parallel"):
        assert flag in r.output, flag


def test_startup_errors_are_clear(ckpt, monkeypatch):
    r = CliRunner().invoke(_app(), ["serve", "--model", "/no/such/dir"])
    assert r.exit_code == 2 and "neither a bundled name" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(_app(), ["serve", "--model", str(ckpt), "--max-batch-size", "0"])
    assert r.exit_code == 2 and "max_batch_size" in r.output
    busy = free_socket()
    busy.listen()  # a listening socket: the port is taken
    r = CliRunner().invoke(_app(), ["serve", "--model", str(ckpt), "--port", str(busy.getsockname()[1])])
    busy.close()
    assert r.exit_code == 2 and "cannot listen on 127.0.0.1" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(_app(), ["serve", "--model", str(ckpt), "--set", "treshold=0.5"])
    assert r.exit_code == 2 and "unknown generation option(s) treshold; valid:" in r.output
    # a bad value is found once the model is loaded (here: in the engine process), before serving
    r = CliRunner().invoke(_app(), ["serve", "--model", str(ckpt), "--set", "threshold=2", "--port",
                                    str(free_port())])
    assert r.exit_code == 2 and "threshold must be in [0, 1]" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_serve_process_with_branch_parallel_workers(ckpt):
    """``dllm serve --branch-parallel 2`` in its own process: LoPA answers equal single-process LoPA."""
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", "--model", str(ckpt), "--port", str(port),
                             "--branch-parallel", "2", "--num-threads", "1", "--served-model-name", "bp",
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180  # a server and two branch workers start: minutes on a loaded 2-core host
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not become ready"
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
        extra = {"strategy": "lopa", "lopa_branches": 2, "threshold": 0.5}
        r = client.completions.create(model="bp", prompt="the cat sat", max_tokens=16, temperature=0, extra_body=extra)
        assert r.model_extra["dllm"]["strategy"] == "lopa"

        from dllm.loading import load_model
        from dllm.text import load_tokenizer_for

        model, tok = load_model(ckpt), load_tokenizer_for(ckpt)
        ids = tok("the cat sat")["input_ids"]
        out = model.generate(torch.tensor([ids]), return_dict_in_generate=True, max_new_tokens=16, **extra)
        gen = out.sequences[0, len(ids):].tolist()
        if tok.eos_token_id in gen:
            gen = gen[: gen.index(tok.eos_token_id)]
        assert r.choices[0].text == tok.decode(gen, skip_special_tokens=True)
        assert r.model_extra["dllm"]["num_forwards"] == int(out.num_forwards[0])
        with pytest.raises(openai.BadRequestError):  # branch-parallel LoPA is greedy only
            client.completions.create(model="bp", prompt="hi", max_tokens=4, temperature=0.7, extra_body=extra)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0


def test_app_loads_its_model_in_the_background(ckpt, one_thread):
    from dllm.serving.app import create_app
    from dllm.serving.settings import ServerSettings
    from dllm.serving.testing import running_server

    with running_server(create_app(ServerSettings(model=str(ckpt), served_model_name="bg"))) as url:
        assert httpx.get(url + "/health").status_code == 200
        deadline = time.monotonic() + 30
        while httpx.get(url + "/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.post(url + "/v1/completions", json={"model": "bg", "prompt": "hi", "max_tokens": 4}, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    with running_server(create_app(ServerSettings(model="/no/such/dir", served_model_name="bad"))) as url:
        deadline = time.monotonic() + 30
        while httpx.get(url + "/ready").json()["status"] == "loading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert httpx.get(url + "/ready").status_code == 503
        r = httpx.post(url + "/v1/completions", json={"model": "bad", "prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
