#!/bin/sh
# Builds kube-apiserver and kube-proxy of one Kubernetes version for the control-plane lab into
# a cache directory keyed by version and prints that directory. Skips the build when both
# binaries are already there. The first build takes several minutes.
#
#   test/kube/build.sh            # the lab's default version (test/kube/VERSION)
#   test/kube/build.sh v1.34.4    # any version with a module directory here
#
# Each version is a module of its own (test/kube/<version>/: go.mod requiring
# k8s.io/kubernetes at that version, each staging module replaced by its published v0.<minor>.<patch>,
# and go.sum), so a build anywhere uses exactly the same sources. add-version.sh writes one.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
version=${1:-$(cat "$here/VERSION")}
mod="$here/$version"
if [ ! -f "$mod/go.mod" ]; then
	echo "build.sh: no module for $version; versions: $(cd "$here" && ls -d v*/ | tr -d / | tr '\n' ' ')" >&2
	exit 1
fi
pinned=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$mod/go.mod")
[ "$pinned" = "$version" ] || { echo "build.sh: $mod/go.mod requires k8s.io/kubernetes $pinned, not $version" >&2; exit 1; }
out="${PROXYHEALTH_KUBE_CACHE:-$HOME/.cache/proxyhealth/kube}/$version"

mkdir -p "$out"
cd "$mod"
for cmd in kube-apiserver kube-proxy; do
	if [ -x "$out/$cmd" ]; then
		continue
	fi
	echo "build.sh: building $cmd $version into $out" >&2
	# Build to a temporary name so an interrupted build never leaves a
	# binary that looks complete. -mod=readonly: go.sum is what was checked in.
	CGO_ENABLED=0 go build -mod=readonly -trimpath -o "$out/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
	mv "$out/.$cmd.tmp" "$out/$cmd"
done
echo "$out"
