# The two commands: `make run` (the benchmark on its embedded default) and `make test`.
# Both set everything up on a fresh machine and reuse what is already there.

VENV       ?= .venv
PY         := $(VENV)/bin/python
PIP        := $(VENV)/bin/pip
# Portable llama.cpp build: a native build crashes in the AMX kernels on our CPUs.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMA_SPEC := llama-cpp-python[server]>=0.3.36,<0.4

.PHONY: run test install sysdeps lint typecheck clean kmod

$(VENV)/.llama-stamp:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PY) -c "import llama_cpp" 2>/dev/null || \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install "$(LLAMA_SPEC)"
	touch $@

$(VENV)/.pkg-stamp: $(VENV)/.llama-stamp setup.py pyproject.toml hooks/ti_hooks.c hooks/ti_hooks.h
	$(PIP) install -q -e ".[server,plot,dev,model]"
	touch $@

install: $(VENV)/.pkg-stamp

# System packages the test suite needs (kernel headers, qemu, busybox for the
# kernel-module boot test). Skipped when already present.
sysdeps:
	sh kernel_module/install-deps.sh

run: install
	$(VENV)/bin/turboinfer bench

test: install sysdeps
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

kmod:
	$(MAKE) -C kernel_module

clean:
	rm -rf build *.egg-info turboinfer_llama/_ti_hooks*.so
