#!/bin/bash
# Runs in a matrix guest (matrix.sh puts it in the payload): each test binary of the payload's
# tests list in its package's directory, where its testdata is, its output to the console and
# to /vm/out/<package>.log, its status to /vm/out/results. Exits 1 when any failed.
#
#   guest-tests.sh TIMEOUT [RUN]   # -test.timeout of each binary; RUN replaces every -test.run
set -uo pipefail

timeout=$1 run_override=${2:-}
failed=0
while read -r pkg run skip; do
	args=(-test.count=1 -test.v -test.timeout="$timeout")
	[ -n "$run_override" ] && run=$run_override
	[ "$run" = - ] || args+=(-test.run="$run")
	[ "$skip" = - ] || args+=(-test.skip="$skip")
	log=/vm/out/$(echo "$pkg" | tr / _).log
	echo "=== package $pkg: ${args[*]}"
	(cd "src/$pkg" && "./$(basename "$pkg").test" "${args[@]}") 2>&1 | tee "$log"
	status=${PIPESTATUS[0]}
	echo "$pkg $status" >>/vm/out/results
	[ "$status" -eq 0 ] || failed=1
done <tests.list
exit "$failed"
