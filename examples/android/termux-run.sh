#!/bin/sh
# Run turboinfer on the phone itself, inside Termux (https://termux.dev).
# Usage: sh termux-run.sh [--dry-run] setup|bench|serve MODEL.gguf [DEVICE]
#   setup         install build tools and turboinfer-llama into Termux's Python
#   bench MODEL   benchmark power saving on/off with DEVICE (default: kgsl)
#   serve MODEL   OpenAI-compatible server on 127.0.0.1:8000 with DEVICE
# DEVICE is kgsl (Adreno, needs root for the clock) or kmod (after
# `turboinfer android deploy` from the host). Setting the GPU clock needs root:
# the commands run through `su -c` when su exists.
set -eu

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi

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
    run pkg install -y python clang cmake ninja git
    # Same portable llama.cpp build flags as on the host (no native tuning surprises).
    export CMAKE_ARGS="-DGGML_NATIVE=OFF"
    run pip install "turboinfer-llama[server]"
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
    if [ "$action" = bench ]; then
        as_root "turboinfer bench --model '$model' --device $device"
    else
        as_root "turboinfer serve --model '$model' --device $device --host 127.0.0.1"
    fi
    ;;
-h|--help|"")
    sed -n '2,9p' "$0"
    ;;
*)
    echo "unknown action '$action' (setup, bench or serve)" >&2
    exit 2
    ;;
esac
