#!/bin/sh
# Builds kube-apiserver and kube-proxy for the control-plane lab into a cache
# directory keyed by version and prints that directory. Skips the build when
# both binaries are already there. The first build takes several minutes.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$here/go.mod")
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in $here/go.mod" >&2; exit 1; }
out="${PROXYHEALTH_KUBE_CACHE:-$HOME/.cache/proxyhealth/kube}/$version"

mkdir -p "$out"
cd "$here"
for cmd in kube-apiserver kube-proxy; do
	if [ -x "$out/$cmd" ]; then
		continue
	fi
	echo "build.sh: building $cmd $version into $out" >&2
	# Build to a temporary name so an interrupted build never leaves a
	# binary that looks complete.
	CGO_ENABLED=0 go build -trimpath -o "$out/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
	mv "$out/.$cmd.tmp" "$out/$cmd"
done
echo "$out"
