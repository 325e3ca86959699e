#!/bin/busybox sh
# SPDX-License-Identifier: GPL-2.0
# /init of the boot-test initramfs (boottest.sh): load simple_ondemand and
# turboinfer.ko virtual=1, run the checks, rmmod; then attach turboinfer.ko to the
# stand-in GPU driver ti_fakegpu.ko by name; print the verdict and the kernel log,
# power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo # end the firmware's last console line, so ours start at column 0

check() { # check NAME COMMAND...: one TI-CHECK line for a shell-level step
	name=$1
	shift
	if "$@"; then echo "TI-CHECK ok $name"; else echo "TI-CHECK FAIL $name"; return 1; fi
}

run_rc=1
exec_rc=1
if check insmod_governor insmod /governor_simpleondemand.ko &&
	check insmod_turboinfer_virtual insmod /turboinfer.ko virtual=1 &&
	check dev_mode_0660 [ "$(stat -c %a /dev/turboinfer)" = 660 ]; then
	/ti_boottest run
	run_rc=$?
	/ti_exec_drive # the native plan executor (hooks/) on the KMOD actuator
	exec_rc=$?
fi
rmmod turboinfer
rmmod_rc=$?

attach_rc=1
if check insmod_rejects_unknown_target sh -c '! insmod /turboinfer.ko target=no-such-gpu' &&
	check insmod_rejects_no_target sh -c '! insmod /turboinfer.ko' &&
	check insmod_fakegpu insmod /ti_fakegpu.ko &&
	check insmod_turboinfer_target insmod /turboinfer.ko target=mali; then
	/ti_boottest attach
	attach_rc=$?
	check rmmod_turboinfer_attached rmmod turboinfer || attach_rc=1
fi
check rmmod_fakegpu rmmod ti_fakegpu || attach_rc=1

# Every phase as NAME=RC; a new guest program (boottest.sh: guest_program) adds its
# own phase above and its NAME=RC here.
/ti_boottest post run="$run_rc" exec="$exec_rc" rmmod="$rmmod_rc" attach="$attach_rc"

# The guest's whole kernel log, for boottest.sh to keep and grep (an oops, WARN or
# BUG fails the verdict there too).
dmesg | sed 's/^/TI-DMESG /'
echo TI-DMESG-END
poweroff -f
