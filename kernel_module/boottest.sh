#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Boot test for turboinfer.ko: build the module against Debian's current
# linux-headers-amd64, fetch the matching linux-image (apt-get download, unpacked
# with dpkg-deb -x, never installed), pack a busybox-static initramfs that loads
# simple_ondemand and turboinfer.ko virtual=1, runs test/ti_boottest, then attaches
# turboinfer.ko target=mali to the stand-in GPU driver test/ti_fakegpu.ko, powers off,
# boot it under qemu TCG with a timeout, and grep the verdict (qemu exits 0 even
# when the guest fails). Exit 0 only on "TURBOINFER-BOOTTEST: PASS".
#
# Environment: TI_BOOT_TIMEOUT (seconds, default 300). Everything fetched or built
# lands in kernel_module/.work/. Needs the packages of install-deps.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$here/.work
timeout_s=${TI_BOOT_TIMEOUT:-300}

for tool in qemu-system-x86_64 busybox cpio gzip gcc dpkg-deb apt-get; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "boottest.sh: $tool missing; run: sudo sh $here/install-deps.sh" >&2
		exit 2
	fi
done
case $(file -b "$(command -v busybox)" 2>/dev/null || echo static) in
*dynamically*)
	echo "boottest.sh: busybox is not static; install busybox-static" >&2
	exit 2
	;;
esac

abi=$(sh "$here/build-debian.sh" | tail -n1)
ver=$(dpkg-query -W -f='${Version}' "linux-headers-$abi")
ko=$work/build-$abi/turboinfer.ko
echo "boottest: kernel ABI $abi ($ver), module $ko"

# The stand-in GPU driver for the target= attach path (test only).
fake_build=$work/build-test-$abi
mkdir -p "$fake_build"
cp "$here/test/Kbuild" "$here/test/ti_fakegpu.c" "$fake_build/"
make -s -C "/usr/src/linux-headers-$abi" M="$fake_build" modules >&2

# The matching kernel image, same ABI and version as the headers.
img=$work/img/$abi
if [ ! -f "$img/root/boot/vmlinuz-$abi" ]; then
	mkdir -p "$img"
	rm -f "$img"/*.deb
	(
		cd "$img"
		apt-get download "linux-image-$abi=$ver" ||
			apt-get download "linux-image-$abi-unsigned=$ver" || {
			apt-get update >/dev/null &&
				apt-get download "linux-image-$abi=$ver"
		}
	) 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2 || true
	deb=$(ls "$img"/linux-image-*.deb 2>/dev/null | head -n1)
	if [ -z "$deb" ]; then
		echo "boottest.sh: could not download linux-image-$abi=$ver" >&2
		exit 2
	fi
	rm -rf "$img/root" "$img/unpack"
	dpkg-deb -x "$deb" "$img/unpack"
	# Keep only what the boot needs: the kernel and the devfreq governors.
	mkdir -p "$img/root/boot" "$img/root/lib/modules/$abi/kernel/drivers"
	mv "$img/unpack/boot/vmlinuz-$abi" "$img/root/boot/"
	mv "$img/unpack/lib/modules/$abi/kernel/drivers/devfreq" \
		"$img/root/lib/modules/$abi/kernel/drivers/"
	rm -rf "$img/unpack" "$deb"
fi
vmlinuz=$img/root/boot/vmlinuz-$abi
gov=$(find "$img/root/lib/modules/$abi" -name 'governor_simpleondemand.ko*' | head -n1)
case $gov in
*.ko) ;;
*)
	echo "boottest.sh: governor_simpleondemand.ko not found (or compressed) in $img" >&2
	exit 2
	;;
esac

# Initramfs: busybox, the two modules, the static test program, /init.
boot=$work/boot
rm -rf "$boot/initramfs"
mkdir -p "$boot/initramfs/bin" "$boot/initramfs/proc" "$boot/initramfs/sys" \
	"$boot/initramfs/dev"
gcc -static -O2 -Wall -Wextra -Werror -o "$boot/initramfs/ti_boottest" \
	"$here/test/ti_boottest.c"
gcc -static -O2 -Wall -Wextra -Werror -pthread -o "$boot/initramfs/ti_exec_drive" \
	"$here/../hooks/tests/ti_exec_drive.c" "$here/../hooks/ti_exec.c" "$here/../hooks/ti_hooks.c" -lm
cp "$(command -v busybox)" "$boot/initramfs/bin/busybox"
cp "$gov" "$boot/initramfs/governor_simpleondemand.ko"
cp "$ko" "$boot/initramfs/turboinfer.ko"
cp "$fake_build/ti_fakegpu.ko" "$boot/initramfs/ti_fakegpu.ko"
cp "$here/test/init.sh" "$boot/initramfs/init"
chmod 755 "$boot/initramfs/init"
(cd "$boot/initramfs" && find . | cpio -o -H newc --quiet | gzip -1) >"$boot/initrd.cpio.gz"

log=$boot/console.log
echo "boottest: booting under qemu TCG (timeout ${timeout_s}s), console in $log"
rc=0
timeout "$timeout_s" qemu-system-x86_64 -accel tcg -nographic -no-reboot -m 512 \
	-kernel "$vmlinuz" -initrd "$boot/initrd.cpio.gz" \
	-append 'console=ttyS0 panic=-1 quiet loglevel=4' </dev/null >"$log" 2>&1 || rc=$?
tr -d '\r' <"$log" | grep -E '^(TI-CHECK FAIL|TI-TIMING|TI-RUN|TI-ATTACH|TI-EXEC|TURBOINFER-BOOTTEST)' || true
if [ "$rc" -eq 124 ]; then
	echo "boottest: qemu timed out after ${timeout_s}s" >&2
fi
if tr -d '\r' <"$log" | grep -q '^TURBOINFER-BOOTTEST: PASS$'; then
	exit 0
fi
echo "boottest: FAIL; last console lines:" >&2
tr -d '\r' <"$log" | tail -n 40 >&2
exit 1
