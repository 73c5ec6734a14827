"""``dllm serve --replicas 2`` on Ray Serve: same answers as one server, requests spread over the replicas, a
killed replica replaced without a hung request, and no Ray process left after SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from dllm.serving.testing import build_checkpoint, free_socket

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.slow

PROMPTS = ["1 + 1 =", "the sky is", "count: one two", "a b c"]


def _ray_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if "ray::" in (proc.info["name"] or "") + line or "/ray/core/src/ray/" in line or "ray/dashboard" in line:
            found.append(proc)
    return found


def _replicas() -> list[psutil.Process]:
    """Live Ray Serve replica processes (a killed one stays a zombie until Ray reaps it: not alive)."""
    found = []
    for p in _ray_processes():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "ServeReplica" in " ".join(p.info["cmdline"] or [p.info["name"]]):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _chat(url: str, prompt: str, timeout: float = 60) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=timeout,
                      json={"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8})


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("replicas"), seed=4)


@pytest.fixture(scope="module")
def single_answers(ckpt):
    """The answers of one in-process server of the same checkpoint."""
    from fastapi.testclient import TestClient

    from dllm.serving.app import create_app
    from dllm.serving.settings import ServerSettings
    from dllm.serving.state import load_bundle

    settings = ServerSettings(model=str(ckpt), served_model_name="m", engine_process=False)
    bundle = load_bundle(settings)
    with TestClient(create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer)) as client:
        answers = {}
        for prompt in PROMPTS:
            reply = client.post("/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8})
            assert reply.status_code == 200, reply.text
            answers[prompt] = reply.json()["choices"][0]["message"]["content"]
    return answers


def test_two_replicas_answer_like_one_server_and_recover(ckpt, single_answers):
    assert not _ray_processes(), "a Ray cluster is already running here"
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", "--model", str(ckpt), "--port", str(port),
                             "--num-threads", "1", "--served-model-name", "m", "--replicas", "2",
                             "--replica-cpus", "0.5"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        replicas: set[str] = set()
        while len(replicas) < 2:  # both replicas answered: the app is up and requests are spread
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, f"two replicas never answered (saw {replicas})"
            try:
                reply = httpx.get(url + "/ready", timeout=5)
            except httpx.TransportError:
                time.sleep(1)
                continue
            if reply.status_code == 200:
                replicas.add(reply.headers["x-dllm-replica"])
            else:
                time.sleep(0.5)

        from openai import OpenAI

        client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for prompt, expected in single_answers.items():
            reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}],
                                                   max_tokens=8)
            assert reply.choices[0].message.content == expected

        # Kill one replica's process: every request still gets an answer or a retryable error, never a hang,
        # and Ray Serve brings the replica count back to two.
        victims = _replicas()
        assert len(victims) == 2, [p.name() for p in victims]
        victims[0].kill()
        statuses = []
        recovered: set[str] = set()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                reply = _chat(url, PROMPTS[0], timeout=60)
            except httpx.TimeoutException:
                pytest.fail("a request hung after a replica was killed")
            statuses.append(reply.status_code)
            assert reply.status_code in (200, 500, 502, 503), reply.text
            if reply.status_code == 200:
                assert reply.json()["choices"][0]["message"]["content"] == single_answers[PROMPTS[0]]
                recovered.add(reply.headers["x-dllm-replica"])
            alive = _replicas()
            if len(alive) == 2 and len(recovered) == 2:
                break
            time.sleep(0.5)
        assert len(recovered) == 2, f"the killed replica was not replaced: statuses {statuses}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("dllm serve --replicas did not stop on SIGTERM")
    _, alive = psutil.wait_procs(_ray_processes(), timeout=30)
    assert not alive, f"Ray processes left behind: {[p.name() for p in alive]}"
    assert proc.returncode == 0, proc.stdout.read().decode()[-3000:]
