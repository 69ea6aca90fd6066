#!/bin/sh
# Captures kube-proxy's rules for the version matrix, as root: for each version given (default:
# every version with a module here), the lab's real kube-proxy in iptables mode with the legacy
# and the nft backend and in nftables mode, both IP families (TestCaptureKubeProxyRules, which
# writes collectors/rules/testdata/kube-proxy-matrix/<version>/), then the kernel's answers to
# the readers for those captures (internal/nftnl testdata/matrix/*.replay.json,
# internal/iptlegacy testdata/matrix-*.nat.blob), which their unit tests decode without root.
# Each version's binaries must be built first (test/kube/build.sh <version>).
#
#   test/kube/capture.sh                    # every version
#   test/kube/capture.sh v1.37.2 v1.34.4
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
[ "$#" -gt 0 ] || set -- $(cd "$here" && ls -d v*/ | tr -d /)
cd "$repo"
for version in "$@"; do
	echo "capture.sh: kube-proxy $version" >&2
	PROXYHEALTH_KUBE_VERSION=$version PROXYHEALTH_REQUIRE_KUBE=1 \
		go test -tags e2e -count=1 -timeout 10m -run '^TestCaptureKubeProxyRules$' ./test/e2e/ -update-fixtures
done
# The recordings of these versions' captures (the kernel tests run in namespaces of their own;
# a recording holds handles and generations, so the other versions' are left as they are).
versions=$(printf '%s\n' "$@" | sed 's/\./\\./g' | paste -sd '|')
go test -count=1 -run "^TestKernelMatrix\$/^($versions)\$" ./internal/nftnl/ -args -update
go test -count=1 -run "^TestKernelFixtures\$/^matrix-($versions)-" ./internal/iptlegacy/ -args -update
go test -count=1 -run 'Matrix' ./internal/nftnl/ ./internal/iptlegacy/
