# `make run` launches Parley on the embedded default model; `make test` runs the whole test suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch as pip finds it: the CPU wheel where pip's configuration offers one (these machines); PyPI's Linux default is
# a CUDA build of several GB. `make run TORCH_INDEX="--index-url https://download.pytorch.org/whl/cpu"` takes the CPU
# build from PyTorch's own index; a GPU user may install a CUDA build of torch into .venv first.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# llama-cpp-python (a peer server in tests/server) builds llama.cpp from source. A native build enables AMX,
# which traps on some of these machines, and others lack AVX-512 (SIGILL): build for the AVX2 baseline.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AVX512_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

# setuptools' notice on every editable install ("Please be careful with folders in your working directory...") was
# ten lines of asterisks in a new user's first `make run`, about nothing they need to do
EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/pip install -q -e

.PHONY: run test test-gpu setup setup-test clean package

# Python 3.11 or newer first: an older python3 (Ubuntu 22.04's 3.10) went on to download torch, then pip refused
# `pip install -e .` on requires-python. A stamp written once torch is in: the venv's own bin/activate was the target,
# so a torch download that failed (or a Ctrl-C) left it in place, and the next `make run` skipped to `pip install -e .`,
# whose "torch>=2.4" took PyPI's default (on Linux a CUDA build of several GB) whatever TORCH and TORCH_INDEX said.
$(VENV)/.torch:
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Parley needs Python 3.11 or newer; $(PY) is " \
		+ sys.version.split()[0] + ": make run PY=python3.11 (or newer)")'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_INDEX) "$(TORCH)"
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml
	$(EDITABLE) .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed pyproject.toml
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(EDITABLE) ".[test]"
	touch $@

setup: $(VENV)/.installed
setup-test: $(VENV)/.installed-test

run: setup
	$(BIN)/parley $(ARGS)

test: setup-test
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# On a CUDA host: the kernels and the engine's GPU path (tests marked `gpu`; without a GPU they skip or interpret).
# Runs $(PY), whose torch must be a CUDA build (`make test-gpu PY=$(BIN)/python` for the venv).
test-gpu:
	$(PY) -m pytest -q -m gpu tests/kernels tests/engine $(PYTEST_ARGS)

# Installers (packaging/): on Linux the PyInstaller folder, a tarball and a .deb, then the bundle's --self-test
# in a clean environment; on macOS Parley.app and a .dmg (signed when PARLEY_CODESIGN_IDENTITY is set).
package: $(VENV)/.installed
	$(EDITABLE) ".[package]"
	if [ "$$(uname -s)" = Darwin ]; then packaging/build_macos.sh $(ARGS); else packaging/build_linux.sh $(ARGS); fi

clean:
	rm -rf $(VENV)
