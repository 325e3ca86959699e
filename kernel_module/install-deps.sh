#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# System packages for building turboinfer.ko and its qemu boot test.
# Idempotent: when everything is present it exits at once without touching apt.
# Run as root (CI runs `make sysdeps` as root); needs only the Debian archive.
set -eu

# qemu and busybox-static boot the test, linux-headers-amd64 (with its kbuild and gcc)
# builds the module, build-essential/libc6-dev the static checker, cpio/gzip pack the
# initramfs, kmod gives modinfo/insmod, xz-utils/zstd unpack kernel packages.
pkgs="qemu-system-x86 busybox-static linux-headers-amd64 build-essential libc6-dev cpio kmod gzip xz-utils zstd"

missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps.sh: missing packages:$missing" >&2
	echo "install-deps.sh: run as root (sudo sh kernel_module/install-deps.sh)" >&2
	exit 1
fi

echo "install-deps.sh: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086
apt-get install -y --no-install-recommends $missing
