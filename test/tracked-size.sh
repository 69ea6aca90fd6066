#!/bin/sh
# Fails when git tracks a file over 1 MiB: in this tree that is a built output (a binary, an
# image, a profile) that every clone would download. Fixtures stay well below it.
set -eu
limit=$((1024 * 1024))
cd "$(dirname "$0")/.."
big=$(git ls-files -z | xargs -0 stat -c '%s %n' 2>/dev/null | awk -v limit="$limit" '$1 > limit { printf "  %s (%d bytes)\n", $2, $1 }')
if [ -n "$big" ]; then
	echo "tracked files over 1 MiB (built outputs belong in .gitignore, not in git):" >&2
	echo "$big" >&2
	exit 1
fi
