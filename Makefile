# `make run` launches Parley on the embedded default model; `make test` runs the whole test suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch; a GPU user installs the CUDA build of torch before `pip install .`.
TORCH ?= torch==2.13.0

.PHONY: run test setup setup-test clean

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install -q -e ".[test]"
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

run: setup
	$(BIN)/parley $(ARGS)

test: setup-test
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV)
