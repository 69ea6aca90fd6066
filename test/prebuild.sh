#!/usr/bin/env bash
# Builds, into their caches, everything the later stages of `make test` build once on a fresh
# machine: the VM guests' root and kernels (test/vm), etcd (test/etcd), kube-apiserver and
# kube-proxy of the default version (test/kube).
# Each is a no-op once cached.
#
#   test/prebuild.sh          # in the foreground
#   test/prebuild.sh start    # in the background, at the lowest priority, logging to .build/
#   test/prebuild.sh wait     # waits for the background run, prints its log, fails as it did
#
# `make test-all` starts it before vet and the unit tests and waits for it before the stages
# that need its outputs: on a fresh machine the builds (tens of minutes of compiling, and
# mmdebstrap's downloads) overlap the unit tests, which spend much of their time waiting on
# timers and on the kernel.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
state="$repo/.build/prebuild"

build() {
	cd "$repo"
	local kernel
	# The root first: mostly downloads and unpacking, which the compiles below do not slow.
	test/vm/build.sh root >/dev/null
	for kernel in $(awk '!/^#/ && NF { print $1 }' test/vm/kernels); do
		test/vm/build.sh kernel "$kernel" >/dev/null
	done
	test/etcd/build.sh >/dev/null
	test/kube/build.sh >/dev/null
}

case "${1:-}" in
"")
	build
	;;
start)
	mkdir -p "$state"
	rm -f "$state/rc"
	echo "prebuild: building the caches in the background (log: $state/log)"
	(
		rc=0
		nice -n 19 "$0" >"$state/log" 2>&1 || rc=$?
		echo "$rc" >"$state/rc"
	) </dev/null &
	;;
wait)
	[ -d "$state" ] || { echo "prebuild: not started" >&2; exit 1; }
	start=$SECONDS
	# Bounded: the builds take tens of minutes on a fresh machine, not hours.
	while [ ! -f "$state/rc" ]; do
		if ((SECONDS - start > 7200)); then
			echo "prebuild: still running after 2h" >&2
			exit 1
		fi
		sleep 5
	done
	echo "prebuild: waited $((SECONDS - start))s; its log:"
	sed 's/^/  /' "$state/log"
	rc=$(cat "$state/rc")
	[ "$rc" = 0 ] || { echo "prebuild: failed (status $rc)" >&2; exit "$rc"; }
	;;
*)
	echo "usage: $0 [start|wait]" >&2
	exit 2
	;;
esac
