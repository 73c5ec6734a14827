"""``torchrun --nproc-per-node 2 -m dllm serve --tensor-parallel 2`` on 2 gloo CPU processes answers like one
process: the same texts, finish reasons and forward counts for greedy d2f, threshold and LoPA requests (a streamed
one, a batch of two prompts, a ``max_tokens`` cut and a stop string: the server's own stopping criterion,
which rank 0 evaluates and broadcasts), a sampled request with a seed, and batches of different settings
taking turns. SIGTERM to rank 0 drains it and stops the other rank: both exit, and torchrun with them. With
``--branch-parallel 2`` too, 4 processes form a branch x tensor mesh whose LoPA answers are one process's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

MODEL = "tiny-d2f"
CHATS = [  # (messages content, extra_body): greedy requests whose answers the bundled model gets right or near
    ("What is 123 + 45 ?", {}),
    ("reverse : Ann Bob Cal", {"strategy": "threshold", "threshold": 0.9}),
    ("What is 17 + 26 ?", {"strategy": "threshold", "stop": ["3"]}),  # cut by a stop string in the text
    ("sort : 9 4 7 1", {"max_tokens": 3}),  # cut by max_tokens before the canvas ends
    ("What is 48 + 25 ?", {"strategy": "lopa", "lopa_branches": 2}),
]


def _free_port() -> int:
    from dllm.serving.testing import free_socket

    with free_socket() as sock:
        return sock.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _rank(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"RANK=")), None)


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _ask(client, content: str, extra: dict) -> dict:
    extra = dict(extra)
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": extra.pop("max_tokens", 16), **extra}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    j = r.json()
    return {"text": j["choices"][0]["message"]["content"], "finish": j["choices"][0]["finish_reason"],
            "forwards": j["dllm"]["num_forwards"]}


def _stream(client, content: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": 0,
            "max_tokens": 16, "stream": True}
    text = []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    text.append(delta[0]["delta"]["content"])
    return "".join(text)


def _batch(client) -> list[str]:
    """Two chat-formatted prompts in one completions request: a batch of two rows."""
    import dllm

    tok = dllm.load_tokenizer(MODEL)
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=False)
               for c in ("What is 5 + 7 ?", "reverse : Kim Fay")]
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompts, "max_tokens": 16, "temperature": 0})
    assert r.status_code == 200, r.text
    return [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def _sampled(client) -> list[str]:
    """temperature > 0 with a seed: a batch of its own with its own generator, the same draws on every rank."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 48 + 25 ?"}], "temperature": 1.0,
            "seed": 7, "n": 2, "max_tokens": 16}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return [c["message"]["content"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def _answers(url: str) -> dict:
    with httpx.Client(base_url=url, timeout=120) as client:
        out = {"chats": [_ask(client, c, e) for c, e in CHATS], "stream": _stream(client, CHATS[0][0]),
               "batch": _batch(client), "sampled": _sampled(client)}
        with ThreadPoolExecutor(len(CHATS)) as pool:  # batches of different settings stepped in turn
            out["concurrent"] = list(pool.map(lambda ce: _ask(client, *ce), CHATS))
    return out


@pytest.mark.slow
def test_tensor_parallel_server_answers_like_one_process_and_stops_on_sigterm():
    from dllm.serving.app import create_app
    from dllm.serving.settings import ServerSettings
    from dllm.serving.state import load_bundle
    from dllm.serving.testing import running_server

    port = _free_port()
    proc = _launch(port, 2, "--tensor-parallel", "2")
    try:
        # the single-process reference, computed while the ranks load
        settings = ServerSettings(model=MODEL)
        bundle = load_bundle(settings)
        app = create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer)
        with running_server(app) as url:
            want = _answers(url)
        url = f"http://127.0.0.1:{port}"
        _wait_ready(proc, url)
        ranks = {_rank(p): p for p in _children(proc.pid)}
        assert set(ranks) == {"0", "1"}
        got = _answers(url)
        assert got == want
        assert want["chats"][0]["text"] == "168" and want["stream"] == "168" and all(want["batch"])
        assert want["chats"][2]["finish"] == "stop" and want["chats"][3]["finish"] == "length"
        assert all(c["forwards"] >= 1 for c in want["chats"])

        out = _stop_with_sigterm_to_rank0(proc, ranks)  # rank 0 drains, then tells the others to stop
    finally:
        _kill_all(proc)
    assert out.count("serving 'tiny-d2f' on http://127.0.0.1:") == 1  # rank 0 alone listens and says so
    assert "tensor parallel over 2 ranks" in out


def _launch(port: int, nproc: int, *flags: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                             str(nproc), "-m", "dllm", "serve", "--model", MODEL, *flags, "--port", str(port),
                             "--num-threads", "1", "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the tensor-parallel server did not become ready"
        time.sleep(0.2)


def _stop_with_sigterm_to_rank0(proc: subprocess.Popen, ranks: dict) -> str:
    """SIGTERM to rank 0: every rank and torchrun exit with 0 and none is left behind. Returns stdout."""
    os.kill(ranks["0"], signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert all(not Path(f"/proc/{pid}").exists() for pid in ranks.values())
    return out


def _kill_all(proc: subprocess.Popen) -> None:
    """What a failed test left running: torchrun's ranks, then torchrun."""
    if proc.poll() is None:
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


MESH_CHATS = [  # greedy LoPA requests of several branch counts, and a d2f one, sent at once
    ("What is 48 + 25 ?", {"strategy": "lopa", "lopa_branches": 3}),
    ("sort : 9 4 7 1", {"strategy": "lopa", "lopa_branches": 2}),
    ("reverse : Ann Bob Cal", {"strategy": "lopa", "lopa_branches": 4, "skip_threshold": 0.8}),
    ("What is 123 + 45 ?", {}),
]


@pytest.mark.slow
def test_branch_by_tensor_mesh_server_answers_like_one_process():
    """``--tensor-parallel 2 --branch-parallel 2 --join`` on 4 gloo processes (a 2 x 2 branch x tensor mesh):
    LoPA requests, one at a time and concurrent, get the texts and forward counts of one process; SIGTERM to
    rank 0 stops all four ranks."""
    from dllm.serving.app import create_app
    from dllm.serving.settings import ServerSettings
    from dllm.serving.state import load_bundle
    from dllm.serving.testing import running_server

    port = _free_port()
    proc = _launch(port, 4, "--tensor-parallel", "2", "--branch-parallel", "2", "--join")
    try:
        settings = ServerSettings(model=MODEL)
        bundle = load_bundle(settings)
        app = create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer)
        with running_server(app) as url, httpx.Client(base_url=url, timeout=120) as client:
            want = [_ask(client, c, e) for c, e in MESH_CHATS]
        url = f"http://127.0.0.1:{port}"
        _wait_ready(proc, url)
        ranks = {_rank(p): p for p in _children(proc.pid)}
        assert set(ranks) == {"0", "1", "2", "3"}
        with httpx.Client(base_url=url, timeout=120) as client:
            # the second replica's ranks (2, 3) work for LoPA rounds only: their CPU time shows where branches ran
            ticks = {r: _cpu_ticks(ranks[r]) for r in ("2", "3")}
            assert [_ask(client, c, e) for c, e in MESH_CHATS[3:] * 3] == want[3:] * 3
            idle = {r: _cpu_ticks(ranks[r]) - ticks[r] for r in ticks}
            ticks = {r: _cpu_ticks(ranks[r]) for r in ("2", "3")}
            assert [_ask(client, c, e) for c, e in MESH_CHATS] == want
            busy = {r: _cpu_ticks(ranks[r]) - ticks[r] for r in ticks}
            # each request twice, at once: LoPA batches one at a time on the ranks (requests of one setting
            # share a batch), the d2f ones beside
            with ThreadPoolExecutor(2 * len(MESH_CHATS)) as pool:
                assert list(pool.map(lambda ce: _ask(client, *ce), MESH_CHATS * 2)) == want * 2
        assert all(busy[r] >= 3 and busy[r] > idle[r] for r in busy), (idle, busy)  # 10-13 against 0-1 (idle CPU)
        assert want[0]["text"] == "73" and want[3]["text"] == "168"
        out = _stop_with_sigterm_to_rank0(proc, ranks)
    finally:
        _kill_all(proc)
    assert "tensor parallel over 2 ranks x 2 branch replicas" in out


def test_tensor_parallel_without_a_matching_torchrun_is_one_line(monkeypatch):
    from typer.testing import CliRunner

    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    for var in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(var, raising=False)
    result = CliRunner().invoke(app, ["serve", "--tensor-parallel", "2", "--port", "0"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --tensor-parallel 2 runs under torchrun --nproc-per-node 2 "
                                     "(this run has WORLD_SIZE=1)")
    assert "Traceback" not in result.output
    result = CliRunner().invoke(app, ["serve", "--tensor-parallel", "2", "--replicas", "2", "--port", "0"])
    assert result.exit_code == 2 and "does not combine with --replicas" in result.output
    result = CliRunner().invoke(app, ["serve", "--tensor-parallel", "2", "--branch-parallel", "2", "--port", "0"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --tensor-parallel 2 --branch-parallel 2 runs under torchrun "
                                     "--nproc-per-node 4 (this run has WORLD_SIZE=1)")
