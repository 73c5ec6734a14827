"""Fixtures shared by every test package."""

import os

import pytest

# One compute thread per pytest process, set before anything imports torch: `make test` runs two workers on
# two cores, and a worker's second OpenMP thread spins on the core the other worker needs (the reference-parity
# file took 31 s with two threads beside a busy process and 22 s with one). Tests that need more threads set
# them; OMP_NUM_THREADS given by the caller wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_tiny_d2f():
    """``dllm serve --model tiny-d2f`` on a free loopback port, as the docs start it; yields the port."""
    import contextlib
    import os
    import subprocess
    import sys
    import time

    import httpx

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "dllm.cli", "serve", "--model", "tiny-d2f", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            assert time.time() < deadline, "the server did not become ready in 120 s"
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="session")
def moe_checkpoints(tmp_path_factory):
    """The tiny LLaDA2 and LLaDA-MoE checkpoints of tests/fixtures/moe/ (published layouts, built once per run
    from their recipes, digests checked): ``{"llada2": dir, "llada-moe": dir}``."""
    import hashlib
    import json
    from pathlib import Path

    from dllm.testing import save_tiny_moe_checkpoint

    spec = json.loads((Path(__file__).parent / "fixtures" / "moe" / "checkpoints.json").read_text())
    root = tmp_path_factory.mktemp("moe")
    out = {}
    for family, entry in spec.items():
        path = root / family
        save_tiny_moe_checkpoint(path, **entry["recipe"])
        got = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.glob("*.safetensors"))}
        assert got == entry["sha256"], f"the {family} checkpoint differs from its recipe's (tests/fixtures/moe)"
        out[family] = path
    return out


def pytest_collection_modifyitems(config, items):
    """Files holding a test marked ``slow`` run first, each file's tests in their own order.

    ``make test`` hands whole files to its workers (pytest-xdist ``--dist loadfile``) in collection order, and
    the alphabetical order puts the multi-process training files last: a worker that starts a 150-second file
    when the others have nothing left keeps the whole run waiting. Longest first leaves only short files for
    the end; the number of slow tests stands for a file's length. The sort is stable and its key is the file,
    so every worker computes the same order."""
    from collections import Counter

    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])
