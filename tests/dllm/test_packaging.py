"""The built wheel carries what an installed dllm needs outside the repository: every package, under
the one import root `dllm`, both bundled models and the licence. Installing the wheel into a folder
and importing from another directory then runs without the source tree."""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "dllm" / "bundled"


def _setuptools_version() -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # --no-build-isolation keeps this offline; the build backend must then be installed here
    if _setuptools_version() < (77,):
        pytest.skip("needs setuptools>=77 installed to build the wheel without isolation")
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy: pip builds in the source tree and would leave build/ and *.egg-info there
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for pkg in ("dllm", "decoding", "training", "serving", "eval"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        check=True, capture_output=True, text=True, timeout=240,
    )
    (out / "build.log").write_text(build.stdout + build.stderr)
    import dllm

    [whl] = list(out.glob(f"dllm-{dllm.__version__}-*.whl"))  # the version has one source
    return whl


def test_the_wheel_builds_without_a_package_left_out_of_the_configuration(wheel):
    # setuptools names every importable folder that pyproject's `packages` misses (a new subpackage, or
    # a bundled model whose name is an identifier); such a folder's modules would silently not ship
    log = (wheel.parent / "build.log").read_text()
    assert "Building wheel for dllm" in log  # -v shows the backend's output, where the warning goes
    missing = sorted(set(re.findall(r"Package '([\w.]+)' is absent from the `packages` configuration", log)))
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"


def test_wheel_holds_packages_bundled_models_and_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"dllm"}  # nothing generic (eval/, training/, ...) lands in site-packages
    for pkg in ("dllm", "dllm/decoding", "dllm/decoding/kernels", "dllm/decoding/loops", "dllm/training",
                "dllm/serving", "dllm/eval", "dllm/eval/tasks"):
        assert f"{pkg}/__init__.py" in names
    for folder in ("decoding", "training", "serving", "eval"):  # every module of the repository folders
        for path in (REPO / folder).rglob("*.py"):
            assert f"dllm/{folder}/{path.relative_to(REPO / folder).as_posix()}" in names, path
    for model_dir in sorted(p for p in BUNDLED.iterdir() if p.is_dir()):
        shipped = {f.name for f in model_dir.iterdir() if f.is_file()}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= shipped
        for f in shipped:
            assert f"dllm/bundled/{model_dir.name}/{f}" in names, f
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    installed = sum(info.file_size for info in zipfile.ZipFile(wheel).infolist())
    assert installed <= 100 * 2**20, f"the installed package would take {installed / 2**20:.1f} MiB (at most 100)"
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert "dllm = dllm.cli:main" in zipfile.ZipFile(wheel).read(
        meta.replace("METADATA", "entry_points.txt")).decode()


def test_installed_wheel_generates_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, text=True, timeout=240,
    )
    code = "\n".join([
        "import dllm, json",
        f"assert dllm.__file__.startswith({str(target)!r}), dllm.__file__",
        "m = dllm.load_model('tiny-d2f'); t = dllm.load_tokenizer('tiny-d2f')",
        "[r] = dllm.generate_text(m, t, 'reverse : Ann Bob Cal', strategy='d2f')",
        "print(json.dumps(r.text))",
    ])
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == '"Cal Bob Ann"'


def _make_dry_run(*args: str) -> str:
    run = subprocess.run(["make", "-n", "-B", "venv", "VENV=/nonexistent/venv", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.replace("\\\n", " ")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_makefile_never_installs_torch_from_an_unpinned_index():
    """torch comes from a local wheel (no network) or PyTorch's CPU index, never from whatever index
    pip would search by default (PyPI's torch is the CUDA build on Linux); the index is overridable."""
    [line] = [x for x in _make_dry_run().splitlines() if "torch==" in x and "pip install" in x]
    installs = [part for part in line.split("||") if "pip install" in part]
    assert len(installs) == 2
    assert "--no-index" in installs[0] and "--no-deps" in installs[0]
    assert '--index-url "https://download.pytorch.org/whl/cpu"' in installs[1]
    gpu = _make_dry_run("TORCH_INDEX=https://download.pytorch.org/whl/cu128")
    assert '--index-url "https://download.pytorch.org/whl/cu128"' in gpu
