#!/usr/bin/env bash
# The lab stages of `make test`, side by side:
#   - the guests' labs, the kernel matrix (`make kernels`) and then the IPVS lab
#     (`make ipvs-lab`): CPU-bound, every guest instruction emulated by QEMU's TCG;
#   - the host's labs (`make e2e`): mostly waiting, on kube-proxy's sync period, the exporter's
#     grace periods and Prometheus's scrapes.
# The guests run at the lowest priority, so they fill e2e's waits without taking the CPU from
# the processes e2e times; their output goes to a log, printed once e2e is done. On a 2-core
# machine this takes the guests' minutes off the end of `make test`.
#
#   test/labs.sh     # needs test/prebuild.sh start to have run (make test-all does)
set -euo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
dir=.build/labs
mkdir -p "$dir"
rm -f "$dir/guests.rc"

test/prebuild.sh wait vm
echo "labs: the kernel matrix and then the IPVS lab run beside e2e, at the lowest priority (log: $dir/guests.log)"
(
	rc=0
	SECONDS=0
	{
		nice -n 19 "$make" --no-print-directory kernels &&
			test/prebuild.sh wait etcd kube &&
			nice -n 19 "$make" --no-print-directory ipvs-lab
	} >"$dir/guests.log" 2>&1 </dev/null || rc=$?
	echo "labs: the guests' labs took ${SECONDS}s" >>"$dir/guests.log"
	echo "$rc" >"$dir/guests.rc"
) &
guests=$!

e2e=0
SECONDS=0
{ test/prebuild.sh wait etcd kube && "$make" --no-print-directory kube etcd e2e; } || e2e=$?
echo "labs: e2e took ${SECONDS}s; waiting for the guests' labs"
wait "$guests" || true
echo "labs: the guests' labs' output:"
cat "$dir/guests.log"
guests_rc=$(cat "$dir/guests.rc" 2>/dev/null || echo 1)
[ "$e2e" = 0 ] || { echo "labs: e2e failed (status $e2e)" >&2; exit "$e2e"; }
[ "$guests_rc" = 0 ] || { echo "labs: the guests' labs failed (status $guests_rc)" >&2; exit "$guests_rc"; }
