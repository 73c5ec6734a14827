# Two commands: `make demo` and `make test`. Both create .venv on first use.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
# torch is installed first, from PyTorch's CPU wheel index, so no later dependency resolution can pull
# the multi-GB CUDA build. A torch wheel that pip's find-links (a local wheelhouse) already holds is
# used without the network (its pure-Python dependencies come with the install step).
# For a GPU: make demo TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or any index of torch wheels).
TORCH       ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test lint venv install-demo install-test clean

$(VPY):
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

venv: $(VPY)
	@$(VPY) -c "import torch" 2>/dev/null || $(PIP) install -q --no-index --no-deps "$(TORCH)" 2>/dev/null \
		|| $(PIP) install -q --index-url "$(TORCH_INDEX)" "$(TORCH)"

install-demo: venv
	$(PIP) install -q -e ".[eval]"

# DeepSpeed builds against the torch already installed (no build isolation, which would fetch a CUDA torch);
# its 2-process CPU ZeRO-2 run is part of the tests
install-test: venv
	$(PIP) install -q -e ".[test]"
	@$(VPY) -c "import deepspeed" 2>/dev/null || $(PIP) install -q --no-build-isolation "deepspeed>=0.15"

demo: install-demo
	$(VPY) -m dllm.eval.demo

# Three pytest workers (pytest-xdist) on two cores, one test file each at a time (--dist loadfile keeps a
# module's fixtures in one worker), each computing on one thread (tests/conftest.py, which also starts the
# longest files first). A third worker fills the time the others spend waiting on the servers and launched
# processes they start: on 2 cores the suite took 678 s with two workers and 555 s with three, which kept
# 1.9 cores busy on average. TEST_WORKERS=0 runs the suite in this process, one test at a time.
TEST_WORKERS ?= 3
test: install-test
	$(VPY) -m pytest -q -m "not gpu" --durations=10 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) tests

# Style check (pyproject [tool.ruff]); ruff comes with the dev extra.
lint: venv
	$(PIP) install -q -e ".[dev]"
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
