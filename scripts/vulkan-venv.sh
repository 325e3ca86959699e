#!/bin/sh
# SPDX-License-Identifier: MIT
# Build llama-cpp-python with llama.cpp's Vulkan backend into its own venv, so the
# hook tests can run with every layer offloaded to Mesa's lavapipe (a CPU Vulkan
# device). Idempotent: each stage is skipped when its result is already there.
#
# Why trixie headers: bookworm's Vulkan headers (1.3.239) lack vk::LayerSettingEXT,
# which llama.cpp's Vulkan backend needs. We fetch trixie's libvulkan-dev and
# spirv-headers with a private apt config and unpack them, never install them, so
# the system stays a plain bookworm. The loader, lavapipe and glslc stay bookworm's.
#
# Usage: scripts/vulkan-venv.sh [VENV]   (default .venv-vulkan)
# Env:   VK_CACHE (default .cache/vulkan), PYTHON (default python3)
set -eu

VENV=${1:-.venv-vulkan}
CACHE=${VK_CACHE:-.cache/vulkan}
PYTHON=${PYTHON:-python3}
LLAMA_SPEC=${LLAMA_SPEC:-"llama-cpp-python>=0.3.36,<0.4"}
# Portable CPU flags, as in the Makefile: a native build crashes in the AMX kernels.
CPU_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

# 1. bookworm: Vulkan loader, Mesa (lavapipe), shader compiler.
need=""
dpkg -s libvulkan1 >/dev/null 2>&1 || need="$need libvulkan1"
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need="$need mesa-vulkan-drivers"
command -v glslc >/dev/null 2>&1 || need="$need glslc"
if [ -n "$need" ]; then
    echo "vulkan-venv: installing$need"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get install -y --no-install-recommends $need || {
        $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends $need; }
fi

# 2. trixie: headers only, downloaded and unpacked, not installed.
ROOT="$CACHE/trixie-root"
if [ ! -f "$ROOT/.stamp" ]; then
    APT="$CACHE/apt"
    mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/debs" "$APT/etc"
    : > "$APT/status"
    cat > "$APT/etc/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
SRC
    set -- -o Dir::Etc::SourceList="$APT/etc/sources.list" \
        -o Dir::Etc::SourceParts=/nonexistent \
        -o Dir::State="$APT" -o Dir::State::Lists="$APT/lists" \
        -o Dir::State::status="$APT/status" -o Dir::Cache="$APT" \
        -o Dir::Cache::archives="$APT/archives" \
        -o APT::Get::List-Cleanup=false -o Debug::NoLocking=true
    apt-get "$@" update
    (cd "$APT/debs" && apt-get "$@" download libvulkan-dev spirv-headers)
    rm -rf "$ROOT" && mkdir -p "$ROOT"
    for deb in "$APT"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
    touch "$ROOT/.stamp"
fi
INC="$ROOT/usr/include"
test -f "$INC/vulkan/vulkan.hpp" || { echo "vulkan-venv: no vulkan.hpp in $INC" >&2; exit 1; }

# The unpacked libvulkan.so points at libvulkan.so.1, which lives in the system.
LIBVK=$(ldconfig -p | awk '/libvulkan\.so\.1 /{print $NF; exit}')
test -n "$LIBVK" || { echo "vulkan-venv: libvulkan.so.1 not found" >&2; exit 1; }

# 3. The venv and the Vulkan build of llama-cpp-python.
if [ ! -f "$VENV/.llama-stamp" ]; then
    test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip setuptools wheel
    start=$(date +%s)
    CMAKE_ARGS="-DGGML_VULKAN=ON $CPU_ARGS -DVulkan_INCLUDE_DIR=$INC \
-DVulkan_LIBRARY=$LIBVK -DCMAKE_CXX_FLAGS=-I$INC -DCMAKE_PREFIX_PATH=$ROOT/usr" \
        "$VENV/bin/pip" install --no-cache-dir --force-reinstall --no-deps \
        --no-binary llama-cpp-python "$LLAMA_SPEC"
    "$VENV/bin/pip" install -q "$LLAMA_SPEC"   # its pure-Python deps
    end=$(date +%s)
    echo "vulkan-venv: llama-cpp-python (Vulkan) built in $((end - start)) s" \
        | tee "$VENV/build-time.txt"
    touch "$VENV/.llama-stamp"
fi
