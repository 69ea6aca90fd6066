#!/bin/sh
# Builds kube-apiserver and kube-proxy of one Kubernetes version for the control-plane lab into
# a cache directory keyed by version and prints that directory. Skips the build of a binary
# already there. The first build takes several minutes.
#
#   test/kube/build.sh            # the lab's default version (test/kube/VERSION)
#   test/kube/build.sh v1.34.4    # any version with a module directory here
#   test/kube/build.sh v1.34.4 kube-proxy   # only these commands (an older kube-proxy
#                                           # against the default kube-apiserver: version skew)
#
# Each version is a module of its own (test/kube/<version>/: go.mod requiring
# k8s.io/kubernetes at that version, each staging module replaced by its published v0.<minor>.<patch>,
# and go.sum), so a build anywhere uses exactly the same sources. add-version.sh writes one.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
version=${1:-$(cat "$here/VERSION")}
[ $# -gt 0 ] && shift
cmds=${*:-kube-apiserver kube-proxy}
for cmd in $cmds; do
	case $cmd in
	kube-apiserver | kube-proxy) ;;
	*) echo "build.sh: $cmd is not built here (kube-apiserver, kube-proxy)" >&2; exit 1 ;;
	esac
done
mod="$here/$version"
if [ ! -f "$mod/go.mod" ]; then
	echo "build.sh: no module for $version; versions: $(cd "$here" && ls -d v*/ | tr -d / | tr '\n' ' ')" >&2
	exit 1
fi
pinned=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$mod/go.mod")
[ "$pinned" = "$version" ] || { echo "build.sh: $mod/go.mod requires k8s.io/kubernetes $pinned, not $version" >&2; exit 1; }
out="${PROXYHEALTH_KUBE_CACHE:-$HOME/.cache/proxyhealth/kube}/$version"

# The version the binaries report (--version, /version, kubernetes_build_info), as Kubernetes'
# own build stamps it (hack/lib/version.sh); without it they say v0.0.0-master.
minor=${version#v1.}
minor=${minor%%.*}
ldflags=
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

mkdir -p "$out"
cd "$mod"
for cmd in $cmds; do
	if [ -x "$out/$cmd" ]; then
		continue
	fi
	echo "build.sh: building $cmd $version into $out" >&2
	# Build to a temporary name so an interrupted build never leaves a
	# binary that looks complete. -mod=readonly: go.sum is what was checked in.
	CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$out/.$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
	mv "$out/.$cmd.tmp" "$out/$cmd"
done
echo "$out"
