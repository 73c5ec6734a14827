"""One import root: the five folders at the repository root are `dllm` and its subpackages; every module
imports on its own; no two files import each other, directly or through others (function-level imports
included, since a lazy import is still a dependency)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# folder at the repository root -> the package it installs as (pyproject.toml's package-dir)
ROOTS = {"dllm": "dllm", "decoding": "dllm.decoding", "training": "dllm.training", "serving": "dllm.serving",
         "eval": "dllm.eval"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in ROOTS.items():
        base = REPO / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if folder == "dllm" and parts[:1] in (("decoding",), ("training",), ("serving",), ("eval",)):
                continue
            out[".".join((package, *parts))] = path
    return out


MODULES = _modules()


def _imported(module: str, path: Path) -> set[str]:
    """Project modules that ``module`` imports anywhere in its file (the longest known module prefix)."""
    is_package = path.name == "__init__.py"
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names += [target] + [f"{target}.{a.name}" for a in node.names]
    found = set()
    for name in names:
        parts = name.split(".")
        while parts and ".".join(parts) not in MODULES:
            parts.pop()
        if parts and ".".join(parts) != module:
            found.add(".".join(parts))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_every_package_folder_is_installed_under_dllm():
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert cfg["package-dir"] == {package: folder for folder, package in ROOTS.items()}
    folders = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    # the bundled models are data, listed where Python could import their folder (setuptools warns otherwise)
    bundled = REPO / "dllm" / "bundled"
    data = {"dllm.bundled"} | {f"dllm.bundled.{d.name}" for d in bundled.iterdir() if d.is_dir() and d.name.isidentifier()}
    assert set(cfg["packages"]) == folders | data


def test_no_import_cycles_between_files():
    graph = {m: _imported(m, p) for m, p in MODULES.items()}
    assert sum(map(len, graph.values())) > 150  # the parser sees the imports at all
    assert graph["dllm.decoding.decode_session"] >= {"dllm.decoding.registry", "dllm.decoding.state"}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.slow
def test_every_module_imports_on_its_own(tmp_path):
    """Each module imported first, in a fresh set of dllm modules (torch and the rest stay loaded). Each module
    is compiled once, into a temporary bytecode cache: its source is read again for every module that imports
    it, and where the environment sets PYTHONDONTWRITEBYTECODE, compiling it each time took a fifth of the test."""
    code = "\n".join([
        "import importlib, sys",
        "import torch, transformers",  # compiled already, in site-packages: imported before the cache moves
        f"sys.dont_write_bytecode, sys.pycache_prefix = False, {str(tmp_path)!r}",
        f"names = {sorted(m for m in MODULES if not m.endswith('__main__'))!r}",
        "bad = []",
        "for n in names:",
        "    for k in [k for k in sys.modules if k == 'dllm' or k.startswith('dllm.')]:",
        "        del sys.modules[k]",
        "    try:",
        "        importlib.import_module(n)",
        "    except Exception as err:",
        "        bad.append(f'{n}: {type(err).__name__}: {err}')",
        "print('\\n'.join(bad) or 'ok')",
    ])
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO.parent, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == "ok", run.stdout


def test_modules_resolve_to_the_repository_files():
    """What an IDE's "go to definition" and a traceback show: the file in the repository."""
    code = "import dllm.decoding.engine, dllm.eval.tasks; print(dllm.decoding.engine.__file__, dllm.eval.tasks.__file__)"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO.parent, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    engine, tasks = run.stdout.split()
    installed_from_repo = Path(engine).is_relative_to(REPO)
    if not installed_from_repo:
        pytest.skip("dllm is installed from a wheel here, not from this repository")
    assert Path(engine) == REPO / "decoding" / "engine.py"
    assert Path(tasks) == REPO / "eval" / "tasks" / "__init__.py"


def _shadowing_project(tmp_path: Path) -> Path:
    """A user's project with its own eval/, training/, serving/ and decoding/ packages."""
    for name in ("eval", "training", "serving", "decoding"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('the user project {name} was imported')\n")
    return tmp_path


@pytest.mark.slow
def test_a_project_with_its_own_eval_and_training_folders(tmp_path):
    project = _shadowing_project(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(project)}
    dllm_cmd = [sys.executable, "-m", "dllm.cli"]
    gen = subprocess.run([*dllm_cmd, "generate", "What is 12 + 30 ?", "--json"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=240)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert '"text": "42"' in gen.stdout
    bench = subprocess.run([*dllm_cmd, "bench", "--model", "tiny", "--suite", "arith", "--strategies", "threshold",
                            "--n", "2", "--no-progress", "--threads", "1"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=240)
    assert bench.returncode == 0, bench.stderr[-2000:]
    assert "threshold" in bench.stdout
    serve = subprocess.run([*dllm_cmd, "serve", "--help"], cwd=project, env=env, capture_output=True, text=True,
                           timeout=120)
    assert serve.returncode == 0 and "--max-batch-size" in serve.stdout, serve.stderr[-2000:]
    # and the user's own packages are still theirs
    own = subprocess.run([sys.executable, "-c", "import eval"], cwd=project, env=env, capture_output=True, text=True)
    assert "the user project eval was imported" in own.stderr


def test_no_generic_top_level_package_is_importable():
    run = subprocess.run([sys.executable, "-c", "import decoding"], cwd=REPO.parent, capture_output=True, text=True)
    assert run.returncode != 0 and "No module named 'decoding'" in run.stderr
