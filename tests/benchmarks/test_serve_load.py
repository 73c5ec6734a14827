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


def test_offline_mixed_settings_run_grouped_and_keep_the_request_order(serve_load):
    """--mix: request i uses set i % N; offline groups the requests by settings and returns each
    request's text where the request was, equal to running it alone with its settings."""
    from dllm.loading import resolve_model_path

    offline = serve_load.Offline(resolve_model_path("tiny"), 8, {"strategy": "threshold"})
    prompts = serve_load.prompts_for(5)[:2]  # an arith and a gsm prompt
    mix = [{"threshold": 1.0}, {"threshold": 0.5}]
    both = offline.run(prompts, 4, mix)
    assert "grouped by settings" in both["mode"]
    for i, prompt in enumerate(prompts):
        alone = offline.run([prompt], 1, [mix[i % 2]])
        assert alone["texts"] == [both["texts"][i]] and alone["forwards"] == [both["forwards"][i]]
    assert both["forwards"][0] > both["forwards"][1]  # threshold 1.0: one token per forward
