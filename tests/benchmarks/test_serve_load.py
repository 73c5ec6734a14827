"""benchmarks/serve_load.py: mode parsing and the server CPU count (engine process included)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def serve_load(load_benchmark):
    return load_benchmark("serve_load")


def test_modes(serve_load):
    assert serve_load.parse_mode("no-join") == (False, None, True)
    assert serve_load.parse_mode("join") == (True, None, True)
    assert serve_load.parse_mode("join@2") == (True, 2.0, True)
    assert serve_load.parse_mode("no-join:inproc") == (False, None, False)
    assert serve_load.parse_mode("join@0:inproc") == (True, 0.0, False)
    for bad in ("nojoin", "no-join@2", "join:remote", "join@x"):
        with pytest.raises(ValueError):
            serve_load.parse_mode(bad)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="Linux /proc")
def test_cpu_seconds_counts_child_processes(serve_load):
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)"
    script = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {busy!r}]); time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while serve_load.cpu_seconds(parent.pid) < 0.5:  # the parent itself only sleeps
            assert time.monotonic() < deadline, "the child's CPU time was not counted"
            time.sleep(0.1)
    finally:
        for child in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split():
            os.kill(int(child), 9)
        parent.kill()
        parent.wait()
