#!/bin/sh
# Builds the etcd the control-plane lab and the benchmarks run, at the version go.mod here
# pins, into a cache directory keyed by version, and prints the binary's path. Skips the build
# when the binary is already there.
#
#   test/etcd/build.sh
#
# This directory is a module of its own (go.mod requiring go.etcd.io/etcd/server/v3, and
# go.sum), so a build anywhere uses exactly the same sources, and etcd's dependencies stay out
# of the exporter's go.mod. Static (CGO_ENABLED=0): the same binary runs in a VM guest.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "require" && $2 == "go.etcd.io/etcd/server/v3" { print $3 }' "$here/go.mod")
[ -n "$version" ] || { echo "build.sh: $here/go.mod requires no go.etcd.io/etcd/server/v3" >&2; exit 1; }
out="${PROXYHEALTH_ETCD_CACHE:-$HOME/.cache/proxyhealth/etcd}/$version"

if [ ! -x "$out/etcd" ]; then
	echo "build.sh: building etcd $version into $out" >&2
	mkdir -p "$out"
	cd "$here"
	# Build to a temporary name so an interrupted build never leaves a binary that looks
	# complete. -mod=readonly: go.sum is what was checked in.
	CGO_ENABLED=0 go build -mod=readonly -trimpath -o "$out/.etcd.tmp" go.etcd.io/etcd/server/v3
	mv "$out/.etcd.tmp" "$out/etcd"
fi
echo "$out/etcd"
