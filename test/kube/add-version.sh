#!/bin/sh
# Writes test/kube/<version>/, the module build.sh builds one Kubernetes version from:
# k8s.io/kubernetes at that version, every staging module its go.mod replaces with ./staging/...
# replaced by the published k8s.io/<module> v0.<minor>.<patch>, and go.sum from `go mod tidy`.
#
#   test/kube/add-version.sh v1.35.4
set -eu

here=$(cd "$(dirname "$0")" && pwd)
version=${1:?usage: add-version.sh vX.Y.Z}
case "$version" in
v1.[0-9]*.[0-9]*) ;;
*) echo "add-version.sh: $version is not v1.<minor>.<patch>" >&2; exit 1 ;;
esac
staging=v0.${version#v1.}
mod="$here/$version"
[ ! -e "$mod" ] || { echo "add-version.sh: $mod exists" >&2; exit 1; }

# The staging modules are the replaces of k8s.io/kubernetes' own go.mod.
kgomod=$(go mod download -json "k8s.io/kubernetes@$version" | awk -F'"' '$2 == "GoMod" { print $4 }')
[ -n "$kgomod" ] || { echo "add-version.sh: k8s.io/kubernetes@$version not found" >&2; exit 1; }

mkdir "$mod"
trap 'rm -rf "$mod"' EXIT
cp "$here/tools.go.in" "$mod/tools.go"
{
	printf 'module github.com/proxyhealth/proxyhealth/test/kube/k8s-%s\n\n' "$version"
	printf 'go %s\n\n' "$(go env GOVERSION | sed 's/^go//')"
	printf 'require k8s.io/kubernetes %s\n\n' "$version"
	echo 'replace ('
	grep -oE '^[[:space:]]*k8s.io/[a-z0-9-]+ => ./staging' "$kgomod" | awk '{ print $1 }' | sort -u |
		while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
	echo ')'
} >"$mod/go.mod"
(cd "$mod" && go mod tidy)
trap - EXIT
echo "$mod"
