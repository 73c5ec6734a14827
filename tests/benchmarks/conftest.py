"""Helpers for the tests of the scripts in benchmarks/ (plain scripts, not an importable package)."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_benchmark():
    """``load_benchmark("lopa_winners")`` -> the script as a module."""
    return _load


@pytest.fixture(scope="session")
def run_benchmark():
    """``run_benchmark(name, argv)`` -> ``main(argv)``; torch's thread count, which the scripts set, is restored."""

    def run(name: str, argv: list[str]):
        threads = torch.get_num_threads()
        try:
            return _load(name).main(argv)
        finally:
            torch.set_num_threads(threads)

    return run
