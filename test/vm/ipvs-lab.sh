#!/usr/bin/env bash
# The IPVS lab (make ipvs-lab): the control-plane lab's IPVS tests (test/e2e, TestDriftCutOffIPVS
# and TestSyncFailingIPVS)
# with the real kube-proxy in --proxy-mode=ipvs, in a guest of the kernel matrix, because this
# machine's kernel has no IPVS. One guest per kube-proxy version, side by side, each with the
# whole lab inside: etcd, kube-apiserver (test/kube/VERSION's: an apiserver serves a kube-proxy up
# to three minors older), kube-proxy of its version, the exporter and the test binary.
#
#   KUBE_PROXY_VERSIONS='v1.34.4 v1.37.2'  the kube-proxy versions (default: test/kube/VERSION's,
#                                           what CI runs; the oldest of test/kube/ with
#                                           the newest: 'v1.34.4 v1.37.2')
#   IPVS_KERNEL=6.1                         the kernel (a name of test/vm/kernels)
#   RUN=REGEXP                              the tests (default: TestDriftCutOffIPVS and
#                                           TestSyncFailingIPVS, and TestCaptureKubeProxyIPVS
#                                           with CAPTURE=1)
#   VM_TIMEOUT=45m                          how long one guest may run before it is killed
#   VM_PARALLEL=0                           the guests one after another, not side by side
#   CAPTURE=1                               also write each version's IPVS capture
#                                           (TestCaptureKubeProxyIPVS -update-fixtures) into
#                                           collectors/rules/testdata/kube-proxy-matrix/<version>/ipvs/
#   PROXYHEALTH_LAB_WAIT_SCALE=4            how much longer than on the host the lab waits
#                                           (test/e2e; more on a loaded machine)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
default_version=$(cat "$repo/test/kube/VERSION")
versions=${KUBE_PROXY_VERSIONS:-$default_version}
kernel=${IPVS_KERNEL:-6.1}
run=${RUN:-'^(TestDriftCutOffIPVS|TestSyncFailingIPVS)$'}
[ "${CAPTURE:-0}" = 0 ] || run=${RUN:-'^(TestDriftCutOffIPVS|TestSyncFailingIPVS|TestCaptureKubeProxyIPVS)$'}
vm_timeout=${VM_TIMEOUT:-45m}
test_timeout=40m
# The kernel matrix's modules and what kube-proxy's IPVS mode needs: its schedulers (it checks
# the one it uses by creating a virtual server with it), ipset, and the dummy kube-ipvs0.
modules="nf_conntrack nf_conntrack_netlink nf_tables nft_compat nfnetlink_log br_netfilter veth ip_tables ip6_tables iptable_nat iptable_filter iptable_raw ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh ip_set dummy"

work=$(mktemp -d "${TMPDIR:-/tmp}/proxyhealth-ipvs-lab.XXXXXX")
trap 'rm -rf "$work"' EXIT
common="$work/common"
mkdir -p "$common/bin" "$common/src/test/e2e"

# The control plane's binaries, built once and cached (test/kube, test/etcd): kube-apiserver of
# the default version, kube-proxy of each version.
cd "$repo"
kube_default=$(test/kube/build.sh "$default_version")
for v in $versions; do
	test/kube/build.sh "$v" kube-proxy >/dev/null
done
etcd=$(test/etcd/build.sh)
echo "ipvs-lab: building the lab" >&2
export CGO_ENABLED=0 GOOS=linux GOARCH=amd64
# No -race: the emulated guest is slow enough.
go test -c -trimpath -tags e2e -o "$common/src/test/e2e/e2e.test" ./test/e2e
go build -trimpath -tags e2e -o "$common/bin/" . ./test/e2e/labtool
cp "$etcd" "$common/etcd"
"$here/build.sh" kernel "$kernel" >/dev/null
"$here/build.sh" root >/dev/null

# run_version V: one guest, its status and time appended to the summary.
run_version() {
	local v=$1 start=$SECONDS status=0 payload="$work/payload-$1"
	# Hard links: the payloads share the large files on the host; each guest gets its copy.
	cp -al "$common" "$payload"
	mkdir -p "$payload/kube"
	ln "$kube_default/kube-apiserver" "$payload/kube/kube-apiserver"
	ln "$(dirname "$kube_default")/$v/kube-proxy" "$payload/kube/kube-proxy"
	chmod -R a+rX "$payload"
	local args=(-test.count=1 -test.v -test.timeout="$test_timeout" -test.run="$run")
	[ "${CAPTURE:-0}" = 0 ] || args+=(-update-fixtures)
	# The capture, written in the guest's copy of the tree, comes back through /vm/out.
	local capture="collectors/rules/testdata/kube-proxy-matrix/$v/ipvs"
	"$here/run.sh" -k "$kernel" -n "$kernel kube-proxy $v" -p "$payload" -o "$work/out-$v" -t "$vm_timeout" -M "$modules" -m 4096 -c 2 \
		-e PROXYHEALTH_REQUIRE_ALL=1 -e PROXYHEALTH_E2E_BINARIES=/vm/payload/bin -e PROXYHEALTH_LAB_WAIT_SCALE="${PROXYHEALTH_LAB_WAIT_SCALE:-4}" \
		-e PROXYHEALTH_KUBE_BIN=/vm/payload/kube -e PROXYHEALTH_KUBE_VERSION="$v" -e PROXYHEALTH_ETCD=/vm/payload/etcd \
		-- bash -c 'cd src/test/e2e && ./e2e.test "${@:2}"; status=$?; cp -r "../../$0" /vm/out/ 2>/dev/null; exit $status' "$capture" "${args[@]}" ||
		status=$?
	if [ "${CAPTURE:-0}" != 0 ] && [ "$status" -eq 0 ]; then
		mkdir -p "$repo/$capture"
		cp "$work/out-$v/ipvs/"* "$repo/$capture/"
		echo "ipvs-lab: capture written to $capture" >&2
	fi
	echo "$v $status $((SECONDS - start))" >>"$work/summary"
}
for v in $versions; do
	if [ "${VM_PARALLEL:-1}" = 0 ]; then
		run_version "$v"
	else
		run_version "$v" &
	fi
done
wait

echo
echo "IPVS lab (Linux $kernel):"
failed=0
while read -r v status secs; do
	echo "  kube-proxy $v: $([ "$status" -eq 0 ] && echo ok || echo "FAIL (status $status)") in ${secs}s"
	[ "$status" -eq 0 ] || failed=1
done <"$work/summary"
exit "$failed"
