"""``dllm serve`` as a process: drained shutdown, and no engine process left behind by any signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

from dllm.serving.testing import build_checkpoint, free_socket

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("lifecycle"), seed=2)


def _start(ckpt, *extra: str) -> tuple[subprocess.Popen, str]:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", "--model", str(ckpt), "--port", str(port),
                             "--num-threads", "1", "--served-model-name", "m", "--log-level", "warning", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def _wait_ready(proc, url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.1)


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _wait_for(url: str, name: str, value: float, timeout: float = 60) -> None:
    """Wait on the server's own gauges rather than a sleep, which a loaded machine can outrun."""
    deadline = time.monotonic() + timeout
    while _gauge(url, name) != value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        time.sleep(0.05)


def _children(proc) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _gone(procs: list[psutil.Process], timeout: float = 15) -> bool:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return not alive


def test_sigterm_drains_running_requests_and_answers_queued_ones_503(ckpt):
    proc, url = _start(ckpt, "--max-batch-size", "1", "--max-batches", "1", "--drain-timeout", "30")
    try:
        _wait_ready(proc, url)
        children = _children(proc)
        assert children  # the engine process
        body = {"model": "m", "prompt": "the cat", "max_tokens": 512, "temperature": 0, "strategy": "vanilla",
                "ignore_eos": True, "block_length": 512}
        results = {}

        def post(name):
            try:
                results[name] = httpx.post(url + "/v1/completions", json=body, timeout=120)
            except httpx.HTTPError as err:  # kept, so that the assertion below says what happened
                results[name] = err

        running = threading.Thread(target=post, args=("running",))
        running.start()
        _wait_for(url, "dllm_running_rows", 1)  # it decodes one token per forward: seconds of work
        queued = threading.Thread(target=post, args=("queued",))
        queued.start()
        _wait_for(url, "dllm_queue_depth", 1)  # one batch of one row at a time: this one waits in the queue
        proc.send_signal(signal.SIGTERM)
        queued.join(30)
        q = results["queued"]
        assert isinstance(q, httpx.Response), q
        assert q.status_code == 503 and q.json()["error"]["code"] == "shutting_down" and "retry-after" in q.headers
        running.join(60)
        r = results["running"]
        assert isinstance(r, httpx.Response), r
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 512
        assert proc.wait(timeout=60) == 0
        assert _gone(children)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_signal_while_the_model_loads_leaves_no_engine_behind(ckpt, sig):
    proc, url = _start(ckpt)
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(proc)):  # the engine process has been spawned and is loading
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        assert code == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
        assert _gone(children), [p.pid for p in children if p.is_running()]
    finally:
        if proc.poll() is None:
            proc.kill()
