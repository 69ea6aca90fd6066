#!/usr/bin/env bash
# Builds, into their caches, everything the later stages of `make test` build once on a fresh
# machine, in three independent parts:
#   vm    the VM guests' root and kernels (test/vm): mostly downloads and unpacking;
#   etcd  etcd (test/etcd): a compile;
#   kube  kube-apiserver and kube-proxy of the default version (test/kube): the longest compile.
# Each is a no-op once cached.
#
#   test/prebuild.sh               # every part, in the foreground
#   test/prebuild.sh part <part>   # one part, in the foreground
#   test/prebuild.sh start         # every part in the background, side by side, at nice 19,
#                                  # each logging to .build/prebuild/<part>.log
#   test/prebuild.sh wait [part…]  # waits for those parts (all by default) at normal priority
#                                  # from then on, prints their logs, fails as one of them did
#
# `make test-all` starts them before vet and the unit tests and waits for each before the stages
# that need its outputs: on a fresh machine the builds (tens of minutes of compiling, and
# mmdebstrap's downloads) overlap the unit tests, which spend much of their time waiting on
# timers and on the kernel. The parts run side by side rather than one after another: the
# downloads leave the CPU idle, and a compile's link step uses one core of the machine's two.
#
# Each part is a session of its own (setsid), so that wait can reach its whole process group.
# Where the kernel schedules sessions as groups (sched_autogroup_enabled, the default of
# Debian's kernels, for tasks in the root cgroup), a process's nice orders it only within its
# session, and each session gets an equal share: the part's session is given nice 19 as well
# (/proc/<pid>/autogroup), or vet and the unit tests would get a third of the CPU beside the
# etcd and kube compiles (vet took 15 min on a fresh machine so, where it took 8 at nice 19).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
state="$repo/.build/prebuild"
parts=(vm etcd kube)

build_part() {
	cd "$repo"
	case "$1" in
	vm)
		local kernel
		test/vm/build.sh root >/dev/null
		for kernel in $(awk '!/^#/ && NF { print $1 }' test/vm/kernels); do
			test/vm/build.sh kernel "$kernel" >/dev/null
		done
		;;
	etcd) test/etcd/build.sh >/dev/null ;;
	kube) test/kube/build.sh >/dev/null ;;
	*)
		echo "prebuild: no part $1 (${parts[*]})" >&2
		return 2
		;;
	esac
}

case "${1:-}" in
"")
	for part in "${parts[@]}"; do
		build_part "$part"
	done
	;;
part)
	if [ -n "${PREBUILD_PGID_FILE:-}" ]; then
		ps -o pgid= -p $$ | tr -d ' ' >"$PREBUILD_PGID_FILE"
	fi
	if [ -n "${PREBUILD_AUTOGROUP_NICE:-}" ] && [ -w /proc/self/autogroup ]; then
		echo "$PREBUILD_AUTOGROUP_NICE" >/proc/self/autogroup 2>/dev/null || true
	fi
	build_part "${2:?usage: $0 part <part>}"
	;;
start)
	mkdir -p "$state"
	for part in "${parts[@]}"; do
		rm -f "$state/$part.rc" "$state/$part.pgid"
		(
			rc=0
			SECONDS=0
			# A process group of its own, so that wait can raise the whole build's priority.
			PREBUILD_PGID_FILE="$state/$part.pgid" PREBUILD_AUTOGROUP_NICE=19 setsid -w nice -n 19 "$0" part "$part" \
				>"$state/$part.log" 2>&1 || rc=$?
			echo "prebuild: $part took ${SECONDS}s" >>"$state/$part.log"
			echo "$rc" >"$state/$part.rc"
		) </dev/null &
	done
	echo "prebuild: building ${parts[*]} in the background (logs: $state/<part>.log)"
	;;
wait)
	shift
	[ $# -gt 0 ] || set -- "${parts[@]}"
	[ -d "$state" ] || { echo "prebuild: not started" >&2; exit 1; }
	failed=0
	for part in "$@"; do
		[ -f "$state/$part.log" ] || { echo "prebuild: $part not started" >&2; exit 1; }
		start=$SECONDS
		# Whatever waits for this build now waits on it alone: from here on it need not leave the
		# CPU to the stages before (its compilers and their children are its process group).
		if [ ! -f "$state/$part.rc" ] && [ -s "$state/$part.pgid" ]; then
			pgid=$(cat "$state/$part.pgid")
			renice -n 0 -g "$pgid" >/dev/null 2>&1 || true
			# The session's share too (the session leader's pid is the group's id).
			{ echo 0 >"/proc/$pgid/autogroup"; } 2>/dev/null || true
		fi
		# Bounded: the builds take tens of minutes on a fresh machine, not hours.
		while [ ! -f "$state/$part.rc" ]; do
			if ((SECONDS - start > 7200)); then
				echo "prebuild: $part still running after 2h" >&2
				exit 1
			fi
			sleep 5
		done
		echo "prebuild: waited $((SECONDS - start))s for $part; its log:"
		sed 's/^/  /' "$state/$part.log"
		rc=$(cat "$state/$part.rc")
		if [ "$rc" != 0 ]; then
			echo "prebuild: $part failed (status $rc)" >&2
			failed=$rc
		fi
	done
	exit "$failed"
	;;
*)
	echo "usage: $0 [part <part>|start|wait [part…]]" >&2
	exit 2
	;;
esac
