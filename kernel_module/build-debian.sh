#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Build turboinfer.ko against Debian's current linux-headers-amd64. The exact ABI
# (e.g. 6.1.0-56-amd64) is read from the metapackage's dependency, never hard-coded.
# Prints the ABI on the last line of stdout; the module lands in .work/build-<ABI>/.
set -eu
here=$(cd "$(dirname "$0")" && pwd)

abi=$(dpkg-query -W -f='${Depends}' linux-headers-amd64 2>/dev/null |
	tr ',' '\n' | sed -n 's/^ *linux-headers-\([^ ]*-amd64\).*/\1/p' | head -n1)
if [ -z "$abi" ]; then
	echo "build-debian.sh: linux-headers-amd64 is not installed;" \
		"run: sudo sh $here/install-deps.sh" >&2
	exit 1
fi
kdir=/usr/src/linux-headers-$abi
if [ ! -d "$kdir" ]; then
	echo "build-debian.sh: $kdir missing; reinstall linux-headers-$abi" >&2
	exit 1
fi
make -s -C "$here" modules KDIR="$kdir" BUILD="$here/.work/build-$abi" >&2
echo "$abi"
