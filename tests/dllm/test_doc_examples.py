"""The Python examples in README.md and docs/*.md run as written. Blocks that need what this
machine lacks (a downloaded 7-8B checkpoint, a running server, names defined only in prose) are
listed with the reason; every other block runs, so a new example is tested by default."""

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# (file, a string that identifies the block) -> why it is not run here
NOT_RUN = {
    ("README.md", "/models/LLaDA-8B-Instruct"): "needs a downloaded 8B checkpoint",
    ("README.md", "OpenAI("): "needs a running server (tests/serving/test_openai_client.py)",
    ("docs/serving.md", "OpenAI("): "needs a running server (tests/serving/test_openai_client.py)",
    ("docs/lopa.md", "BranchParallelExecutor("): "needs a checkpoint path and CUDA; "
                                                 "tests/decoding/test_branch_parallel.py runs the same calls",
}


def _blocks():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        rel = str(path.relative_to(ROOT))
        for i, code in enumerate(BLOCK.findall(path.read_text())):
            skip = next((why for (f, marker), why in NOT_RUN.items() if f == rel and marker in code), None)
            yield rel, i, code, skip


BLOCKS = list(_blocks())


def test_every_exception_still_names_a_block():
    """A NOT_RUN entry whose block was edited away would silently stop mattering."""
    for file, marker in NOT_RUN:
        assert any(f == file and marker in code for f, _, code, _ in BLOCKS), (file, marker)


def test_readme_examples_run_in_one_namespace():
    """README blocks build on each other (the token-level example uses the first one's model)."""
    namespace: dict = {}
    ran = 0
    out = io.StringIO()
    for file, i, code, skip in BLOCKS:
        if file != "README.md" or skip:
            continue
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README.md block {i}", "exec"), namespace)  # noqa: S102
        ran += 1
    assert ran >= 2
    printed = out.getvalue()
    assert "168" in printed  # 123 + 45, the first example's answer
    assert "['168', 'Ann Lee Pam']" in printed


DOCS_BLOCKS = [(f, i, c) for f, i, c, skip in BLOCKS if f != "README.md" and not skip]


def test_docs_have_runnable_examples():
    assert {f for f, _, _ in DOCS_BLOCKS} >= {"docs/kernels.md", "docs/lopa.md"}


@pytest.mark.parametrize("file,i,code", DOCS_BLOCKS, ids=[f"{f}#{i}" for f, i, _ in DOCS_BLOCKS])
def test_docs_examples_run(file, i, code, capsys):
    exec(compile(code, f"{file} block {i}", "exec"), {})  # noqa: S102
    assert capsys.readouterr().out.strip()  # every runnable example prints what it shows
