"""The README's code blocks run as written, with the bundled models, from a fresh working directory.

Every ```bash and ```python block runs unless an HTML comment right above it says
``not run by tests`` and why. Shell lines run in a scratch directory that sees the repository's
``examples/`` and ``recipes/``; Python blocks share one namespace, as a reader runs them in order.
The server block starts ``dllm serve`` on a free port, and the client blocks after it talk to it."""

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BLOCK = re.compile(r"(?:<!--(?P<note>[^>]*)-->\n)?```(?P<lang>bash|python)\n(?P<code>.*?)^```", re.S | re.M)
BLOCKS = [(m["lang"], m["code"], (m["note"] or "").strip()) for m in BLOCK.finditer(README)]
SERVE = "dllm serve --model tiny-d2f --port 8000"


def test_readme_is_short_and_in_order():
    lines = README.splitlines()
    assert len(lines) <= 300
    headings = [line for line in lines if line.startswith("## ")]
    order = ["## Two commands", "## Python", "## Command line", "## Server", "## Supported models", "## Strategies",
             "## Results", "## Layout", "## Guides"]
    assert [o for h in headings for o in order if h.startswith(o)] == order
    assert "3M-parameter" in "\n".join(lines[:12])  # what the bundled models are, up front


def test_every_skipped_block_says_why():
    skipped = [(code, note) for _, code, note in BLOCKS if note.startswith("not run by tests")]
    assert len(skipped) == 2 and all(len(note) > len("not run by tests: ") for _, note in skipped)
    assert "make demo" in skipped[0][0] and SERVE in skipped[1][0]


def test_files_the_readme_names_exist():
    named = set(re.findall(r"(?<![\w/.-])((?:examples|recipes|docs|benchmarks|dllm/bundled)/[\w./-]+\w)", README))
    assert {"examples/prompts.txt", "examples/my.jsonl", "recipes/smoke-sft.yaml"} <= named
    missing = sorted(p for p in named if not (REPO / p).exists())
    assert not missing, missing


def _shell_lines(code: str) -> list[str]:
    text = code.replace("\\\n", " ")
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    for name in ("examples", "recipes"):
        (d / name).symlink_to(REPO / name)
    return d


@pytest.fixture(scope="module")
def env(workdir) -> dict:
    bin_dir = str(Path(sys.executable).parent)
    assert shutil.which("dllm", path=bin_dir), "the dllm command is installed beside this python"
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


def _run(line: str, cwd: Path, env: dict) -> str:
    run = subprocess.run(["bash", "-o", "pipefail", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"{line}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.slow
def test_command_line_block(workdir, env):
    [code] = [code for lang, code, note in BLOCKS if lang == "bash" and "dllm generate" in code]
    lines = _shell_lines(code)
    # independent commands of one thread each (OMP_NUM_THREADS=1): two at a time, as many as the CI's cores
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = dict(zip(lines, pool.map(lambda line: _run(line, workdir, env), lines)))
    text = "\n".join(outputs.values())
    assert "168" in text and '"text": "Cal Bob Ann"' in text and "Ann Lee Pam" in text
    rows = [json.loads(x) for line, out in outputs.items() if "examples/prompts.txt" in line
            for x in out.splitlines() if x.startswith("{")]
    assert len(rows) == len((REPO / "examples" / "prompts.txt").read_text().splitlines())
    assert (workdir / "bench.json").exists() and (workdir / "pareto.png").exists()
    assert "threshold" in next(out for line, out in outputs.items() if "examples/my.jsonl" in line)
    assert (workdir / "runs" / "smoke" / "final" / "model.safetensors").exists()


def test_python_blocks_in_one_namespace(capsys):
    namespace: dict = {}
    ran = 0
    out = io.StringIO()
    for lang, code, _note in BLOCKS:
        if lang != "python" or "OpenAI(" in code:
            continue
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
        ran += 1
    assert ran == 2
    printed = out.getvalue()
    assert printed.startswith("168 ") and "['168', 'Ann Lee Pam']" in printed


@pytest.mark.slow
def test_server_and_client_blocks(served_tiny_d2f, workdir, env):
    """The server block as the docs start it (tests/dllm/conftest.py, on a free port), then the clients."""
    [_serve_code] = [code for lang, code, note in BLOCKS if SERVE in code]
    [client_code] = [code for lang, code, note in BLOCKS if "OpenAI(" in code]
    [curl_code] = [code for lang, code, note in BLOCKS if code.startswith("curl ")]
    port = str(served_tiny_d2f)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(client_code.replace("8000", port), "README.md", "exec"), {})  # noqa: S102
    assert out.getvalue().startswith("42 ")
    streamed = _run(_shell_lines(curl_code)[0].replace("8000", port), workdir, env)
    deltas = [json.loads(x[len("data: "):]) for x in streamed.splitlines() if x.startswith("data: {")]
    assert "".join(d["choices"][0]["delta"].get("content") or "" for d in deltas if d["choices"]) == "Cal Bob Ann"
