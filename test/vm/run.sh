#!/usr/bin/env bash
# Boots one kernel of test/vm/kernels in QEMU, runs a command there as root, and exits with
# its status. test/vm/README.md describes the guest; in short:
#
#   test/vm/run.sh -k 6.1 [-n NAME] [-p DIR] [-o DIR] [-e NAME=VALUE]... [-M 'mod ...'] [-t 20m] \
#       [-m 2048] [-c 2] -- COMMAND [ARG...]
#
#   -k NAME       the kernel (a name in test/vm/kernels)
#   -n NAME       the guest's name in its output (default: the kernel's)
#   -p DIR        copied into the guest as /vm/payload, the command's working directory
#   -o DIR        receives what the command left in the guest's /vm/out
#   -e NAME=VALUE the command's environment (repeatable)
#   -M MODULES    modules to load before the command; one that does not load fails the run
#   -t DURATION   how long the guest may run (timeout(1)'s syntax), then it is killed
#   -m MIB, -c N  the guest's memory and CPUs
#
# The command's output, and the kernel's warnings, stream to stdout, each line prefixed
# "[NAME] " (-n, else the kernel's name). Exit status: the command's; 124 when the guest ran
# out of time; 125 when the guest did not boot, a module did not load, or it stopped before
# the command ended.
#
# QEMU uses KVM where /dev/kvm works, else TCG (PROXYHEALTH_VM_ACCEL=kvm or tcg to choose).
# Images come from build.sh, cached.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

kernel= name= payload= out= modules= timeout=20m memory=2048 cpus=2
envs=()
usage() {
	sed -n '5,13p' "$0" >&2
	exit 125
}
while getopts k:n:p:o:e:M:t:m:c: opt; do
	case $opt in
	k) kernel=$OPTARG ;;
	n) name=$OPTARG ;;
	p) payload=$OPTARG ;;
	o) out=$OPTARG ;;
	e) envs+=("$OPTARG") ;;
	M) modules=$OPTARG ;;
	t) timeout=$OPTARG ;;
	m) memory=$OPTARG ;;
	c) cpus=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ -n "$kernel" ] && [ $# -gt 0 ] || usage
[ -z "$payload" ] || [ -d "$payload" ] || { echo "run.sh: no directory $payload" >&2; exit 125; }

tag="[${name:-$kernel}]"
say() { echo "$tag run.sh: $*" >&2; }

kdir=$("$here/build.sh" kernel "$kernel")
# PROXYHEALTH_VM_ROOT: another root image (a zstd-compressed newc cpio, as build.sh makes).
root=${PROXYHEALTH_VM_ROOT:-$("$here/build.sh" root)}

work=$(mktemp -d "${TMPDIR:-/tmp}/proxyhealth-vm.XXXXXX")
qemu_pid=
cleanup() {
	[ -z "$qemu_pid" ] || kill "$qemu_pid" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# The run's own archive: init, the command and its configuration, the payload. It goes first
# and uncompressed: the kernel unpacks several archives in a row, but only the last may be
# compressed.
mkdir -p "$work/stage/vm/payload"
cp "$here/init" "$work/stage/init"
{
	printf 'VM_MODULES=%q\n' "$modules"
} >"$work/stage/vm/config"
{
	for e in "${envs[@]}"; do
		printf 'export %q\n' "$e"
	done
	printf 'exec'
	printf ' %q' "$@"
	printf '\n'
} >"$work/stage/vm/command"
(cd "$work/stage" && bsdtar --format newc -cf "$work/run.cpio" init vm)
if [ -n "$payload" ]; then
	(cd "$payload" && bsdtar --format newc -s ',^\.,vm/payload,' -cf "$work/payload.cpio" .)
fi
cat "$work/run.cpio" ${payload:+"$work/payload.cpio"} "$kdir/modules.cpio" "$root" >"$work/initrd"
rm -f "$work/run.cpio" "$work/payload.cpio"

# boot ACCEL: starts the guest in the background (qemu_pid), its console to $work/console and
# its report port to $work/report. no_timer_check: on a loaded host an emulated CPU can fail
# the kernel's IO-APIC timer check ("IO-APIC + timer doesn't work!", a panic at boot).
boot() {
	local accel
	case $1 in
	kvm) accel=(-accel kvm -cpu host) ;;
	# Multi-threaded TCG: one host thread per guest CPU.
	tcg) accel=(-accel tcg,thread=multi -cpu max) ;;
	esac
	: >"$work/console"
	: >"$work/report"
	timeout --kill-after=10s "$timeout" qemu-system-x86_64 -nodefaults -no-user-config \
		-display none -monitor none -no-reboot -nic none \
		"${accel[@]}" -m "$memory" -smp "$cpus" \
		-kernel "$kdir/vmlinuz" -initrd "$work/initrd" \
		-append "console=ttyS0 quiet panic=-1 no_timer_check" \
		-serial "file:$work/console" -serial "file:$work/report" \
		</dev/null >"$work/qemu.log" 2>&1 &
	qemu_pid=$!
}

# booted: whether the guest's init has reported.
booted() { grep -q '^proxyhealth-vm: booted' "$work/report"; }

accel=${PROXYHEALTH_VM_ACCEL:-auto}
if [ "$accel" = auto ]; then
	accel=tcg
	if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
		# KVM can fail in ways QEMU only notices once the guest runs (some nested
		# hypervisors stop a guest in the kernel's decompressor with "KVM internal error"):
		# a guest that has not reached init in 60 s is taken for one, and TCG runs it.
		boot kvm
		for _ in $(seq 60); do
			booted || ! kill -0 "$qemu_pid" 2>/dev/null && break
			sleep 1
		done
		if booted; then
			accel=kvm
		else
			kill "$qemu_pid" 2>/dev/null || true
			wait "$qemu_pid" 2>/dev/null || true
			say "KVM did not boot this kernel, using TCG: $(tail -c 300 "$work/qemu.log" | tr '\n' ' ')"
			qemu_pid=
		fi
	fi
fi
[ -n "$qemu_pid" ] || boot "$accel"
say "booting $(cat "$kdir/release") ($accel, $cpus CPU, $memory MiB, timeout $timeout)"

# The console, live, until QEMU exits: sed -u passes each line on at once (tr, or sed without
# -u, would hold the output in its buffer until the guest ends).
tail -n +1 -F --pid="$qemu_pid" "$work/console" 2>/dev/null | sed -u "s/\r$//; s/^/$tag /" &
tail_pid=$!
set +e
wait "$qemu_pid"
qemu_status=$?
set -e
qemu_pid=
wait "$tail_pid" || true

if [ "$qemu_status" -eq 124 ] || [ "$qemu_status" -eq 137 ]; then
	say "the guest ran out of its $timeout and was killed"
	exit 124
fi
if [ "$qemu_status" -ne 0 ]; then
	say "qemu-system-x86_64 failed ($qemu_status): $(cat "$work/qemu.log")"
	exit 125
fi
if [ -n "$out" ] && grep -q '^proxyhealth-vm: out ' "$work/report"; then
	mkdir -p "$out"
	sed -n 's/^proxyhealth-vm: out //p' "$work/report" | base64 -d | tar -xzf - -C "$out"
fi
status=$(sed -n 's/^proxyhealth-vm: exit \([0-9]*\)$/\1/p' "$work/report")
if [ -z "$status" ]; then
	if booted; then
		say "the guest stopped before the command ended (a kernel panic? the console above says)"
	else
		say "the guest did not boot: $(cat "$work/qemu.log")"
	fi
	exit 125
fi
exit "$status"
