#!/usr/bin/env bash
# Installs the Debian packages the tests need (as root), or, when not root, names the missing
# ones and fails. `make test` runs it first, so the README's test command works on a fresh
# machine as it is.
set -euo pipefail

# podman and runc: the image is built (make image) and run under the DaemonSet's securityContext
# (test/e2e TestImage); crun fails on cgroup v1 hosts, so runc. chromium: the verdict labs render
# the landing page in headless Chromium (test/e2e browser_test.go). qemu-system-x86, mmdebstrap,
# libarchive-tools (bsdtar), zstd and kmod (depmod): the kernel matrix builds its guests from
# Debian's kernel packages and boots them (test/vm).
packages=(iptables nftables conntrack iproute2 procps util-linux libcap2-bin make prometheus prometheus-alertmanager podman runc chromium
	qemu-system-x86 mmdebstrap libarchive-tools zstd kmod)
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
((${#missing[@]})) || exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "test/deps.sh: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
	exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
