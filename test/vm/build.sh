#!/usr/bin/env bash
# Builds the pieces a matrix guest boots from Debian packages, into a cache, and prints where
# they are. Each is built once and reused: a kernel is keyed by its package (whose name holds
# the kernel's version), the root by what goes into it.
#
#   test/vm/build.sh kernel 6.1   # a kernel of test/vm/kernels: prints its directory, holding
#                                 # vmlinuz and modules.cpio (its modules under usr/lib/modules,
#                                 # depmod'ed), about 10 s the first time
#   test/vm/build.sh root         # prints root.cpio.zst, a Debian 12 root (mmdebstrap), 3
#                                 # minutes or more the first time
#
# The cache is $PROXYHEALTH_VM_CACHE, by default ~/.cache/proxyhealth/vm. Nothing is installed
# on the host: the kernel package is unpacked with dpkg-deb -x, the root is built by mmdebstrap.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${PROXYHEALTH_VM_CACHE:-$HOME/.cache/proxyhealth/vm}

# What the guest's root holds: the tools the kernel tests and the lab run (iptables in both
# backends, nft, conntrack, ip, sysctl, setpriv, unshare, nsenter), kmod for modprobe, and for
# the control-plane lab in a guest ipset and etcd (kube-apiserver and kube-proxy come from the
# host's build, test/kube/build.sh). minbase has no init: test/vm/init is the guest's.
root_suite=bookworm
root_packages=iptables,nftables,conntrack,iproute2,procps,util-linux,kmod,ipset,etcd-server
# Documentation and translations are never read in a guest; leaving them out keeps the image,
# and the guest's memory, smaller.
root_excludes=('/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*')

# The module directories a guest can load from: netfilter, conntrack, IPVS and ipset, the
# bridge and br_netfilter (net/), what those need (lib/, crypto/, arch/x86/crypto/), and the
# link types the tests and kube-proxy create (veth, dummy). Leaving out the rest (drivers for
# hardware a guest has not, file systems) keeps each kernel's image at a few MiB.
module_dirs=(kernel/net kernel/lib kernel/crypto kernel/arch/x86/crypto)
module_files=(kernel/drivers/net/veth.ko kernel/drivers/net/dummy.ko)

work=
cleanup() { [ -z "$work" ] || rm -rf "$work"; }
trap cleanup EXIT

die() {
	echo "test/vm/build.sh: $*" >&2
	exit 1
}

# kernel_package NAME: the Debian package test/vm/kernels names for NAME.
kernel_package() {
	local pkg
	pkg=$(awk -v name="$1" '$1 == name { print $2 }' "$here/kernels")
	[ -n "$pkg" ] || die "no kernel $1 in test/vm/kernels; kernels: $(awk '!/^#/ && NF { printf "%s ", $1 }' "$here/kernels")"
	echo "$pkg"
}

# download PACKAGE DIR: apt-get download into DIR, updating the package lists once when the
# package is not found in them (a fresh machine's lists may be old or empty).
download() {
	local pkg=$1 dir=$2 apt=(apt-get -q)
	# As root apt downloads as user _apt, who cannot write into a cache under /root: download as
	# root, as apt would after warning.
	[ "$(id -u)" -ne 0 ] || apt+=(-o APT::Sandbox::User=root)
	if (cd "$dir" && "${apt[@]}" download "$pkg" >/dev/null 2>&1); then
		return
	fi
	if [ "$(id -u)" -eq 0 ]; then
		apt-get update -qq >/dev/null
	fi
	(cd "$dir" && "${apt[@]}" download "$pkg" >/dev/null) ||
		die "apt-get download $pkg failed: Debian may no longer serve this ABI; name the current package in test/vm/kernels"
}

build_kernel() {
	local name=$1 pkg out deb version modules dir
	pkg=$(kernel_package "$name")
	out="$cache/kernel/$pkg"
	if [ -f "$out/vmlinuz" ] && [ -f "$out/modules.cpio" ]; then
		echo "$out"
		return
	fi
	echo "test/vm/build.sh: building kernel $name ($pkg) into $out" >&2
	mkdir -p "$cache/kernel"
	work=$(mktemp -d "$cache/kernel/.build.XXXXXX")
	mkdir "$work/deb"
	download "$pkg" "$work/deb"
	deb=$(ls "$work"/deb/*.deb)
	dpkg-deb -x "$deb" "$work/x"
	version=$(ls "$work/x/lib/modules")
	[ "$(echo "$version" | wc -w)" -eq 1 ] || die "$pkg: expected one module tree, found: $version"
	modules="$work/x/lib/modules/$version"

	# The guest's module tree: the directories above, depmod'ed, under usr/lib/modules (the
	# root is merged-/usr; its /lib is a link, which the kernel's initramfs unpacker would not
	# follow, and which is not there yet when this archive is unpacked before the root's).
	dir="$work/m/usr/lib/modules/$version"
	mkdir -p "$dir/kernel/drivers/net"
	cp "$modules"/modules.order "$modules"/modules.builtin* "$dir/"
	for d in "${module_dirs[@]}"; do
		mkdir -p "$dir/$(dirname "$d")"
		cp -a "$modules/$d" "$dir/$d"
	done
	for f in "${module_files[@]}"; do
		# The 6.12 packages compress their modules (.ko.xz); the guest's kmod reads either.
		cp "$modules/$f"* "$dir/$(dirname "$f")/"
	done
	depmod -b "$work/m/usr" "$version"

	mkdir -p "$work/out"
	cp "$work/x/boot/vmlinuz-$version" "$work/out/vmlinuz"
	cp "$work/x/boot/config-$version" "$work/out/config"
	(cd "$work/m" && bsdtar --format newc -cf "$work/out/modules.cpio" usr)
	dpkg-deb -f "$deb" Package Version >"$work/out/package"
	echo "$version" >"$work/out/release"
	rm -rf "$out"
	mv "$work/out" "$out"
	echo "$out"
}

build_root() {
	local key out opts=()
	key=$(printf '%s\n' "$root_suite" "$root_packages" "${root_excludes[@]}" | sha256sum | cut -c1-12)
	out="$cache/root/$root_suite-$key"
	if [ -f "$out/root.cpio.zst" ]; then
		echo "$out/root.cpio.zst"
		return
	fi
	echo "test/vm/build.sh: building the guest root ($root_suite: $root_packages) into $out" >&2
	mkdir -p "$cache/root"
	work=$(mktemp -d "$cache/root/.build.XXXXXX")
	for p in "${root_excludes[@]}"; do
		opts+=("--dpkgopt=path-exclude=$p")
	done
	# The tar mmdebstrap writes becomes a newc cpio, the initramfs format, without unpacking
	# (bsdtar converts, keeping owners and modes), compressed with zstd, which the guest kernels
	# unpack faster than they copy the uncompressed archive.
	mmdebstrap --variant=minbase --include="$root_packages" "${opts[@]}" \
		--aptopt='Acquire::Retries "3"' "$root_suite" "$work/root.tar"
	bsdtar --format newc -cf - @"$work/root.tar" | zstd -q -T0 -3 -o "$work/root.cpio.zst"
	rm "$work/root.tar"
	mkdir -p "$out"
	mv "$work/root.cpio.zst" "$out/root.cpio.zst"
	echo "$out/root.cpio.zst"
}

case "${1:-}" in
kernel)
	[ $# -eq 2 ] || die "usage: build.sh kernel NAME"
	build_kernel "$2"
	;;
root)
	[ $# -eq 1 ] || die "usage: build.sh root"
	build_root
	;;
*)
	die "usage: build.sh kernel NAME | build.sh root"
	;;
esac
