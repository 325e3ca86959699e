#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Boot test for turboinfer.ko: build the module against Debian's current
# linux-headers-amd64, fetch the matching linux-image (apt-get download, unpacked
# with dpkg-deb -x, never installed), pack a busybox-static initramfs that loads
# simple_ondemand and turboinfer.ko virtual=1, runs test/ti_boottest, then attaches
# turboinfer.ko target=mali to the stand-in GPU driver test/ti_fakegpu.ko, prints its
# kernel log, powers off; boot it under qemu TCG with a timeout, and grep the verdict
# (qemu exits 0 even when the guest fails). Exit 0 only on "TURBOINFER-BOOTTEST: PASS"
# and a complete guest kernel log free of oops, WARN and BUG reports.
#
# Environment: TI_BOOT_TIMEOUT (seconds, default 300); TI_FUZZ_SEED (a nonzero
# 32-bit number, default random) seeds the in-guest fuzz and concurrency checks, so a
# failing run can be replayed. Everything fetched or built
# lands in kernel_module/.work/. Needs the packages of install-deps.sh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$here/.work
timeout_s=${TI_BOOT_TIMEOUT:-300}
seed=${TI_FUZZ_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' \n')}

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

# Initramfs: busybox, the two modules, the guest programs, /init.
boot=$work/boot
rm -rf "$boot/initramfs"
mkdir -p "$boot/initramfs/bin" "$boot/initramfs/proc" "$boot/initramfs/sys" \
	"$boot/initramfs/dev"

# guest_program NAME SOURCE... [-- GCC FLAGS...]: build a static program from sources
# (paths relative to kernel_module/) into the initramfs as /NAME.
guest_program() {
	name=$1
	shift
	srcs=""
	while [ $# -gt 0 ] && [ "$1" != -- ]; do
		srcs="$srcs $here/$1"
		shift
	done
	[ $# -gt 0 ] && shift # the --
	# shellcheck disable=SC2086
	gcc -static -O2 -Wall -Wextra -Werror -o "$boot/initramfs/$name" $srcs "$@"
}

# The programs the guest runs; test/init.sh runs each as a phase. To add one: a line
# here, and a phase in test/init.sh that passes NAME=RC to `ti_boottest post`.
guest_program ti_boottest test/ti_boottest.c
guest_program ti_exec_drive ../hooks/tests/ti_exec_drive.c ../hooks/ti_exec.c ../hooks/ti_hooks.c -- -pthread -lm

cp "$(command -v busybox)" "$boot/initramfs/bin/busybox"
cp "$gov" "$boot/initramfs/governor_simpleondemand.ko"
cp "$ko" "$boot/initramfs/turboinfer.ko"
cp "$fake_build/ti_fakegpu.ko" "$boot/initramfs/ti_fakegpu.ko"
cp "$here/test/init.sh" "$boot/initramfs/init"
chmod 755 "$boot/initramfs/init"
(cd "$boot/initramfs" && find . | cpio -o -H newc --quiet | gzip -1) >"$boot/initrd.cpio.gz"

log=$boot/console.log
echo "boottest: booting under qemu TCG (timeout ${timeout_s}s, TI_FUZZ_SEED=$seed), console in $log"
rc=0
timeout "$timeout_s" qemu-system-x86_64 -accel tcg -nographic -no-reboot -m 512 \
	-kernel "$vmlinuz" -initrd "$boot/initrd.cpio.gz" \
	-append "console=ttyS0 panic=-1 quiet loglevel=4 ti_seed=$seed" </dev/null >"$log" 2>&1 || rc=$?
tr -d '\r' <"$log" |
	grep -E '^(TI-CHECK FAIL|TI-SEED|TI-TIMING|TI-RUN|TI-ATTACH|TI-FUZZ|TI-CONCURRENT|TI-RMMOD|TI-EXEC|TURBOINFER-BOOTTEST)' ||
	true
if [ "$rc" -eq 124 ]; then
	echo "boottest: qemu timed out after ${timeout_s}s" >&2
fi

# The guest's kernel log, printed by /init after the verdict: it must be there, whole,
# and free of oops, WARN, BUG, lockdep, KASAN, UBSAN, hung-task and RCU stall reports
# (the list of ti_dmesg_clean() in test/ti_boottest.c).
dmesg_log=$boot/dmesg.log
tr -d '\r' <"$log" | sed -n 's/^TI-DMESG //p' >"$dmesg_log"
bad_re='Oops|WARNING:|BUG:|kernel BUG|cut here|Call Trace|general protection|possible recursive locking|circular locking|Kernel panic|refcount_t:|list_add corruption|list_del corruption|UBSAN:|KASAN:|blocked for more than|rcu: INFO:|self-detected stall'
dmesg_lines=$(wc -l <"$dmesg_log")
dmesg_bad=$(grep -cE "$bad_re" "$dmesg_log" || true)
dmesg_ok=0
if tr -d '\r' <"$log" | grep -q '^TI-DMESG-END$' && [ "$dmesg_lines" -gt 0 ] &&
	[ "$dmesg_bad" -eq 0 ]; then
	dmesg_ok=1
fi
echo "TI-DMESG lines=$dmesg_lines bad=$dmesg_bad complete=$dmesg_ok (guest kernel log in $dmesg_log)"
grep -E "$bad_re" "$dmesg_log" | head -n 20 >&2 || true

if [ "$dmesg_ok" -eq 1 ] && tr -d '\r' <"$log" | grep -q '^TURBOINFER-BOOTTEST: PASS$'; then
	exit 0
fi
echo "boottest: FAIL; last console lines:" >&2
tr -d '\r' <"$log" | tail -n 40 >&2
exit 1
