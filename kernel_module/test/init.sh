#!/bin/busybox sh
# SPDX-License-Identifier: GPL-2.0
# /init of the boot-test initramfs (boottest.sh): load simple_ondemand and
# turboinfer.ko virtual=1, run the checks, rmmod, print the verdict, power off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

run_rc=1
if ! insmod /governor_simpleondemand.ko; then
	echo "TI-CHECK FAIL insmod_governor"
elif ! insmod /turboinfer.ko virtual=1; then
	echo "TI-CHECK FAIL insmod_turboinfer"
else
	mode=$(stat -c %a /dev/turboinfer 2>/dev/null)
	if [ "$mode" = 660 ]; then
		echo "TI-CHECK ok dev_mode_0660"
		/ti_boottest run
		run_rc=$?
	else
		echo "TI-CHECK FAIL dev_mode_0660: mode '$mode'"
	fi
fi
rmmod turboinfer
rmmod_rc=$?
/ti_boottest post "$run_rc" "$rmmod_rc"
poweroff -f
