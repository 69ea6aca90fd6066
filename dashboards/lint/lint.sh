#!/bin/sh
# Lints the committed dashboards with grafana's dashboard-linter (--strict: warnings fail too),
# with the exceptions in dashboards/.lint. The linter is built from this separate module at
# the version its go.mod pins, into a cache keyed by that version; a no-op once built.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
dashboards=$(dirname "$here")
version=$(awk '$1 == "require" && $2 == "github.com/grafana/dashboard-linter" { print $3 }' "$here/go.mod")
[ -n "$version" ] || { echo "lint.sh: no dashboard-linter version in $here/go.mod" >&2; exit 1; }
cache="${PROXYHEALTH_TOOLS_CACHE:-$HOME/.cache/proxyhealth/tools}/dashboard-linter-$version"
linter="$cache/dashboard-linter"

if [ ! -x "$linter" ]; then
	mkdir -p "$cache"
	echo "lint.sh: building dashboard-linter $version into $cache" >&2
	# One of its dependencies (github.com/zeitlinger/conflate) has no entry in the checksum
	# database; go.sum in this module still pins it.
	(cd "$here" && GONOSUMDB=github.com/zeitlinger/conflate CGO_ENABLED=0 \
		go build -trimpath -o "$cache/.dashboard-linter.tmp" github.com/grafana/dashboard-linter)
	mv "$cache/.dashboard-linter.tmp" "$linter"
fi

status=0
for f in "$dashboards"/*.json; do
	echo "lint.sh: $(basename "$f")"
	"$linter" lint --strict -c "$dashboards/.lint" "$f" || status=1
done
exit $status
