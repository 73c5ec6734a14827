"""The Python examples in docs/*.md run as written (the README's: tests/dllm/test_readme.py). Blocks
that need what a CPU test run lacks (a downloaded 7-8B checkpoint, a running server, CUDA) are listed
with the reason; every other block runs, so a new example is tested by default."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# (file, a string that identifies the block) -> why it is not run here
NOT_RUN = {
    ("docs/lopa.md", "BranchParallelExecutor("): "needs a checkpoint path and CUDA; "
                                                 "tests/decoding/test_branch_parallel.py runs the same calls",
}


def _blocks():
    for path in sorted((ROOT / "docs").glob("*.md")):
        rel = str(path.relative_to(ROOT))
        for i, code in enumerate(BLOCK.findall(path.read_text())):
            skip = next((why for (f, marker), why in NOT_RUN.items() if f == rel and marker in code), None)
            yield rel, i, code, skip


BLOCKS = list(_blocks())


def test_every_exception_still_names_a_block():
    """A NOT_RUN entry whose block was edited away would silently stop mattering."""
    for file, marker in NOT_RUN:
        assert any(f == file and marker in code for f, _, code, _ in BLOCKS), (file, marker)


DOCS_BLOCKS = [(f, i, c) for f, i, c, skip in BLOCKS if not skip and "OpenAI(" not in c]
CLIENT_BLOCKS = [(f, i, c) for f, i, c, skip in BLOCKS if not skip and "OpenAI(" in c]


def test_docs_have_runnable_examples():
    assert {f for f, _, _ in DOCS_BLOCKS} >= {"docs/kernels.md", "docs/lopa.md"}


@pytest.mark.parametrize("file,i,code", DOCS_BLOCKS, ids=[f"{f}#{i}" for f, i, _ in DOCS_BLOCKS])
def test_docs_examples_run(file, i, code, capsys):
    from dllm.decoding.registry import STRATEGIES

    # a strategy an example registers (docs/architecture.md's "top2") leaves with it, not in later tests
    before = dict(STRATEGIES)
    try:
        exec(compile(code, f"{file} block {i}", "exec"), {})  # noqa: S102
    finally:
        STRATEGIES.clear()
        STRATEGIES.update(before)
    assert capsys.readouterr().out.strip()  # every runnable example prints what it shows


@pytest.mark.slow
@pytest.mark.parametrize("file,i,code", CLIENT_BLOCKS, ids=[f"{f}#{i}" for f, i, _ in CLIENT_BLOCKS])
def test_client_examples_run_against_a_server(file, i, code, served_tiny_d2f, capsys):
    """Client examples talk to ``dllm serve --model tiny-d2f`` (started on a free port instead of 8000); each
    answer they print is a real one (no empty completions: the prompts are ones the bundled model knows)."""
    exec(compile(code.replace("8000", str(served_tiny_d2f)), f"{file} block {i}", "exec"), {})  # noqa: S102
    printed = capsys.readouterr().out
    assert printed.strip()
    assert "''" not in printed and "[]" not in printed, printed
