#!/usr/bin/env bash
# The kernel matrix (make kernels): builds the kernel tests of test/vm/tests and the lab's
# binaries, boots each kernel of test/vm/kernels with them (run.sh), runs them there as root,
# and fails when any failed, naming the kernel and the package.
#
#   KERNELS='6.1 6.12'   the kernels to boot (default: all of test/vm/kernels)
#   RUN=REGEXP           replaces every package's -test.run (e.g. RUN=TestLabInvalidPackets)
#   VM_TIMEOUT=30m       how long one guest may run before it is killed
#   VM_PARALLEL=0        the guests one after another, not side by side
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
kernels=${KERNELS:-$(awk '!/^#/ && NF { print $1 }' "$here/kernels")}
run=${RUN:-}
vm_timeout=${VM_TIMEOUT:-30m}
# Each test binary's own limit, inside the guest's: a hung test then ends with its goroutines'
# stacks in the log rather than with a killed guest.
test_timeout=15m
# What the tests need of the kernel, loaded before they start: a kernel without one of these
# fails the run there and then, rather than letting a test skip or fail obscurely.
modules="nf_conntrack nf_conntrack_netlink nf_tables nft_compat nfnetlink_log br_netfilter veth ip_tables ip6_tables iptable_nat iptable_filter iptable_raw ip_vs ip_vs_rr"

work=$(mktemp -d "${TMPDIR:-/tmp}/proxyhealth-matrix.XXXXXX")
trap 'rm -rf "$work"' EXIT
payload="$work/payload"
mkdir -p "$payload/bin" "$payload/src"

# The tests list, and the binaries: test binaries per build-tag set, each in its package's
# directory with the package's testdata; the lab's binaries built as its TestMain would.
grep -v '^#' "$here/tests" | awk 'NF { print $1, $3, $4 }' >"$payload/tests.list"
cd "$repo"
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
echo "matrix: building the kernel tests" >&2
for tags in $(grep -v '^#' "$here/tests" | awk 'NF { print $2 }' | sort -u); do
	pkgs=$(grep -v '^#' "$here/tests" | awk -v t="$tags" 'NF && $2 == t { print "./" $1 }')
	tagflag=()
	[ "$tags" = - ] || tagflag=(-tags "$tags")
	# No -race: the emulated guest is slow enough.
	go test -c -trimpath "${tagflag[@]}" -o "$work/tests/" $pkgs
done
while read -r pkg _; do
	mkdir -p "$payload/src/$pkg"
	mv "$work/tests/$(basename "$pkg").test" "$payload/src/$pkg/"
done <"$payload/tests.list"
# What the tests read from the tree, at the same places: every testdata directory (tests read
# their neighbours' too) and the metrics reference the lab checks scrapes against.
git ls-files -z -- ':(glob)**/testdata/**' docs/metrics.md | tar --null -T - -cf - | tar -xf - -C "$payload/src"
go build -trimpath -tags e2e -o "$payload/bin/" . ./test/e2e/labtool
cp "$here/guest-tests.sh" "$payload/"
# The lab runs the exporter as user 65534 from here.
chmod -R a+rX "$payload"

# run_kernel K: one guest, its status and time appended to the summary.
run_kernel() {
	local k=$1 start=$SECONDS status=0
	"$here/run.sh" -k "$k" -p "$payload" -o "$work/out/$k" -t "$vm_timeout" -M "$modules" \
		-e PROXYHEALTH_REQUIRE_ALL=1 -e PROXYHEALTH_E2E_BINARIES=/vm/payload/bin \
		-- ./guest-tests.sh "$test_timeout" "$run" || status=$?
	echo "$k $status $((SECONDS - start))" >>"$work/summary"
}
# The guests run side by side: a test in a guest mostly keeps one emulated CPU busy, so two
# guests share the machine's cores at little cost to each (VM_PARALLEL=0: one after another).
# The images first, so that two guests never build one at the same time.
for k in $kernels; do
	"$here/build.sh" kernel "$k" >/dev/null
done
"$here/build.sh" root >/dev/null
for k in $kernels; do
	if [ "${VM_PARALLEL:-1}" = 0 ]; then
		run_kernel "$k"
	else
		run_kernel "$k" &
	fi
done
wait
mapfile -t failed < <(awk '$2 != 0 { print $1 }' "$work/summary")

# The summary: every kernel's packages, and each failed test by name.
echo
echo "kernel matrix:"
while read -r k status secs; do
	echo "  Linux $k: $([ "$status" -eq 0 ] && echo ok || echo "FAIL (status $status)") in ${secs}s"
	results="$work/out/$k/results"
	if [ ! -f "$results" ]; then
		echo "    the guest reported no results"
		continue
	fi
	while read -r pkg pstatus; do
		if [ "$pstatus" -eq 0 ]; then
			echo "    ok   $pkg"
			continue
		fi
		echo "    FAIL $pkg (status $pstatus)"
		grep -E -- '--- FAIL|^panic:|test timed out' "$work/out/$k/$(echo "$pkg" | tr / _).log" | sed 's/^/      /' || true
	done <"$results"
done <"$work/summary"
if [ ${#failed[@]} -gt 0 ]; then
	echo "kernel matrix: failed on Linux ${failed[*]}" >&2
	exit 1
fi
