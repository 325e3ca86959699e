#!/bin/sh
# Run turboinfer on the phone itself, inside Termux (https://termux.dev).
# Usage: sh termux-run.sh [--dry-run] setup [--vulkan|--opencl] DIST
#        sh termux-run.sh [--dry-run] bench|serve MODEL.gguf [DEVICE]
#   setup DIST    build llama-cpp-python with a GPU backend (Vulkan by default, OpenCL
#                 with --opencl), then install turboinfer from DIST: the wheel or sdist
#                 that `turboinfer android install` pushed (never from a package index)
#   bench MODEL   benchmark the controllers live on DEVICE (default kgsl), battery-metered
#   serve MODEL   OpenAI-compatible server on 127.0.0.1:8000 with DEVICE
# DEVICE is kgsl (Adreno, needs root for the clock) or kmod (after
# `turboinfer android deploy` from the host). Setting the GPU clock needs root:
# the commands run through `su -c` when su exists.
set -eu

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi

# Termux packages: the toolchain, Python's compiled dependencies (no PyPI wheels for
# Termux), and per GPU backend the headers, loader and shader compiler.
BASE_PKGS="python clang cmake ninja binutils rust python-numpy python-scipy"
VULKAN_PKGS="vulkan-headers vulkan-loader-android shaderc"
OPENCL_PKGS="opencl-headers opencl-clhpp ocl-icd"
LLAMA_SPEC="llama-cpp-python>=0.3.36,<0.4"
BACKEND_FILE="${HOME:-.}/.turboinfer-gpu-backend"

run() {
    if [ "$DRY" = 1 ]; then echo "+ $*"; else "$@"; fi
}

as_root() {
    if command -v su >/dev/null 2>&1 || [ "$DRY" = 1 ]; then
        run su -c "$*"
    else
        echo "no su: reading works, setting the GPU clock does not (root the phone)" >&2
        run sh -c "$*"
    fi
}

action="${1:-}"
case "$action" in
setup)
    shift
    backend=vulkan
    case "${1:-}" in
    --vulkan) shift ;;
    --opencl) backend=opencl; shift ;;
    esac
    dist="${1:-}"
    case "$dist" in
    *.whl|*.tar.gz) ;;
    *)
        echo "setup needs DIST, the turboinfer-llama wheel or sdist pushed by" \
            "\`turboinfer android install\` (got '$dist')" >&2
        exit 2
        ;;
    esac
    if [ "$DRY" = 0 ] && [ ! -f "$dist" ]; then
        echo "no package file at $dist (run \`turboinfer android install\` on the host)" >&2
        exit 2
    fi
    run pkg install -y $BASE_PKGS
    if [ "$backend" = vulkan ]; then
        # Adreno 6xx (e.g. the 865's Adreno 650) and Mali: llama.cpp's GPU path is Vulkan.
        run pkg install -y $VULKAN_PKGS
        gpu_args="-DGGML_VULKAN=ON"
    else
        # OpenCL with the Adreno kernels targets Adreno 7xx and newer; the driver's
        # libOpenCL.so lives in /vendor/lib64.
        run pkg install -y $OPENCL_PKGS
        gpu_args="-DGGML_OPENCL=ON -DGGML_OPENCL_USE_ADRENO_KERNELS=ON"
    fi
    run env CMAKE_ARGS="$gpu_args -DGGML_NATIVE=OFF" pip install --force-reinstall \
        --no-cache-dir --no-binary llama-cpp-python "$LLAMA_SPEC"
    run pip install "$dist[server]"
    if [ "$DRY" = 0 ]; then
        echo "$backend" > "$BACKEND_FILE"
        python -c "import llama_cpp, sys; sys.exit(0 if llama_cpp.llama_supports_gpu_offload() else 'llama.cpp was built without a GPU backend')"
    fi
    ;;
bench|serve)
    model="${2:?usage: sh termux-run.sh $action MODEL.gguf [kgsl|kmod]}"
    device="${3:-kgsl}"
    case "$device" in
    kgsl|kmod) ;;
    *) echo "device must be kgsl or kmod, not '$device'" >&2; exit 2 ;;
    esac
    if [ "$DRY" = 0 ] && [ ! -f "$model" ]; then
        echo "no model at $model (copy a GGUF into Termux's home first)" >&2
        exit 2
    fi
    if [ -f "$BACKEND_FILE" ] && [ "$(cat "$BACKEND_FILE")" = opencl ]; then
        export LD_LIBRARY_PATH="/vendor/lib64:${PREFIX:-/data/data/com.termux/files/usr}/lib"
    fi
    ti="${PREFIX:+$PREFIX/bin/}turboinfer"
    if [ "$action" = bench ]; then
        as_root "$ti bench --model '$model' --device $device --meter battery"
    else
        as_root "$ti serve --model '$model' --device $device --host 127.0.0.1"
    fi
    ;;
-h|--help|"")
    sed -n '2,12p' "$0"
    ;;
*)
    echo "unknown action '$action' (setup, bench or serve)" >&2
    exit 2
    ;;
esac
