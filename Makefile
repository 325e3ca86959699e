# The two commands: `make run` (the benchmark on its embedded default) and `make test`.
# Both set everything up on a fresh machine and reuse what is already there.

VENV       ?= .venv
PY         := $(VENV)/bin/python
PIP        := $(VENV)/bin/pip
# Portable llama.cpp build: a native build crashes in the AMX kernels on our CPUs.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
LLAMA_SPEC := llama-cpp-python[server]>=0.3.36,<0.4

# A second venv with llama.cpp's Vulkan backend, for the GPU-backend tests on Mesa's
# lavapipe (a CPU Vulkan device; llama.cpp shows it only with GGML_VK_VISIBLE_DEVICES).
VK_VENV    ?= .venv-vulkan
VK_PY      := $(VK_VENV)/bin/python
VK_ENV     := GGML_VK_VISIBLE_DEVICES=0

.PHONY: run test install sysdeps lint typecheck clean kmod test-vulkan vulkan-install

# The native hooks' sources: either venv's editable install rebuilds them when they change
NATIVE_SRC := hooks/ti_hooks.c hooks/ti_hooks.h hooks/ti_exec.c hooks/ti_exec.h hooks/ti_plan.c hooks/ti_plan.h

$(VENV)/.llama-stamp:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PY) -c "import llama_cpp" 2>/dev/null || \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install "$(LLAMA_SPEC)"
	touch $@

$(VENV)/.pkg-stamp: $(VENV)/.llama-stamp setup.py pyproject.toml $(NATIVE_SRC)
	$(PIP) install -q -e ".[server,plot,dev,model]"
	touch $@

install: $(VENV)/.pkg-stamp

# System packages the test suite needs (kernel headers, qemu, busybox for the
# kernel-module boot test). Skipped when already present.
sysdeps:
	sh kernel_module/install-deps.sh

run: install
	$(VENV)/bin/turboinfer bench

# The whole suite: the main venv runs everything but the Vulkan tests, then the Vulkan
# venv (llama.cpp built with -DGGML_VULKAN=ON, ~12 min once) runs those on Mesa's
# lavapipe, so CI covers the hooks and the live loop on a real GPU backend too.
test: install sysdeps vulkan-install
	$(PY) -m pytest -q -m "not vulkan"
	@echo "make test: the Vulkan tests, under $(VK_VENV) (lavapipe)"
	$(VK_ENV) $(VK_PY) -m pytest -q -m vulkan

# llama-cpp-python built with -DGGML_VULKAN=ON (scripts/vulkan-venv.sh: apt packages,
# trixie's Vulkan headers unpacked under .cache/vulkan), then this package, editable.
$(VK_VENV)/.llama-stamp: scripts/vulkan-venv.sh
	sh scripts/vulkan-venv.sh $(VK_VENV)

$(VK_VENV)/.pkg-stamp: $(VK_VENV)/.llama-stamp setup.py pyproject.toml $(NATIVE_SRC)
	$(VK_VENV)/bin/pip install -q -e ".[server,dev,model]"
	touch $@

vulkan-install: $(VK_VENV)/.pkg-stamp

# Every layer on lavapipe: drop-in, hook and offload tests, then the figures (hook
# semantics per granularity, graph-granularity overhead). Timings are a CPU pretending
# to be a GPU: read them as semantics and ratios only.
test-vulkan: vulkan-install
	$(VK_ENV) $(VK_PY) -m pytest -q -m vulkan
	$(VK_ENV) $(VK_PY) -m turboinfer_llama.bench.gpu_hooks --n-gpu-layers -1 --tokens 8
	$(VK_ENV) $(VK_PY) -m turboinfer_llama.bench.overhead --n-gpu-layers -1 \
	  --granularities graph --rounds 3 --tokens 16

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

kmod:
	$(MAKE) -C kernel_module

clean:
	rm -rf build *.egg-info turboinfer_llama/_ti_hooks*.so
