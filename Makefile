# Two commands: `make demo` and `make test`. Both create .venv on first use.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
# The CPU wheel of torch is installed first, so no dependency resolution can pull a CUDA build.
TORCH   ?= torch==2.13.0

.PHONY: demo test lint venv install-demo install-test clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(VPY)
	@$(VPY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"

install-demo: venv
	$(PIP) install -q -e ".[eval]"

install-test: venv
	$(PIP) install -q -e ".[test]"

demo: install-demo
	$(VPY) -m dllm.demo

test: install-test
	$(VPY) -m pytest -q -m "not gpu" --durations=10 tests

# Style check (pyproject [tool.ruff]); ruff comes with the dev extra.
lint: venv
	$(PIP) install -q -e ".[dev]"
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
