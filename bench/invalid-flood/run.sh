#!/bin/sh
# Measures what a flood of INVALID packets costs with --conntrack.invalid-reasons: hping3 at its
# full rate sends a Service's cluster IP TCP segments with SYN and FIN set for DURATION seconds,
# each one logged by conntrack to NFLOG group 0. Phases of one run, in alternating order, so
# that the load other processes put on the machine falls on each alike:
#
#   none       no exporter: the kernel's side alone (the baseline)
#   unbounded  the exporter with --conntrack.invalid-reasons.max-rate=0 (reads every packet)
#   bounded    the exporter with the default --conntrack.invalid-reasons.max-rate
#
# For each phase it prints hping3's packets sent, the exporter's CPU over the flood
# (utime+stime of /proc/PID/stat, all threads) as a share of one core, the node's softirq time
# over the flood (the softirq column of /proc/stat's cpu line, all CPUs, as a share of one
# core), the Service's tcp_flags count's rise and the exporter's time listened.
#
# Everything runs in two network namespaces the script creates and removes (phf-node-PID with
# the exporter and a kube-proxy shaped DNAT rule, phf-client-PID with hping3, joined by a
# veth pair); the root namespace is not changed. Needs root, iproute2, iptables, hping3, curl,
# taskset and go (or EXPORTER=path to a built binary).
#
# Usage: sudo bench/invalid-flood/run.sh [ROUNDS] [DURATION]
set -eu

ROUNDS=${1:-2}
DURATION=${2:-10}
PORT=19433
node=phf-node-$$
client=phf-client-$$
tmp=$(mktemp -d)
pid=

cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
	ip netns del "$node" 2>/dev/null || true
	ip netns del "$client" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

for tool in ip iptables-restore hping3 curl taskset; do
	command -v "$tool" >/dev/null || { echo "$tool not installed" >&2; exit 1; }
done
if [ -z "${EXPORTER:-}" ]; then
	EXPORTER=$tmp/proxyhealth
	(cd "$(dirname "$0")/../.." && go build -o "$EXPORTER" .)
fi

ip netns add "$node"
ip netns add "$client"
ip link add phf-n type veth peer name phf-c
ip link set phf-n netns "$node"
ip link set phf-c netns "$client"
inn() { ip netns exec "$node" "$@"; }
inc() { ip netns exec "$client" "$@"; }
inn sh -ec 'ip link set lo up; ip link set phf-n up; ip addr add 10.0.1.1/24 dev phf-n
ip addr add 10.0.0.1/32 dev lo; sysctl -qw net.ipv4.ip_forward=1'
inc sh -ec 'ip link set lo up; ip link set phf-c up; ip addr add 10.0.1.2/24 dev phf-c
ip route add default via 10.0.1.1'
# kube-proxy's iptables-mode shape for default/web: cluster IP 10.96.0.20:80 -> 10.0.0.1:8080.
inn iptables-restore <<'EOF'
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEBWEBWEBWEBWEB1 - [0:0]
:KUBE-SEP-WEBWEBWEBWEBWEB1 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEBWEBWEBWEBWEB1
-A KUBE-SVC-WEBWEBWEBWEBWEB1 -m comment --comment "default/web:http -> 10.0.0.1:8080" -j KUBE-SEP-WEBWEBWEBWEBWEB1
-A KUBE-SEP-WEBWEBWEBWEBWEB1 -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.0.0.1:8080
COMMIT
EOF
modprobe nfnetlink_log 2>/dev/null || true
# The kernel logs whether or not the exporter listens, as a node with the flag does (the
# exporter sets the same values, and puts these back on exit).
inn sh -ec 'echo nfnetlink_log > /proc/sys/net/netfilter/nf_log/2; echo 255 > /proc/sys/net/netfilter/nf_conntrack_log_invalid'

# CPU ticks of a process (utime+stime) and of the node's softirq (all CPUs).
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
softirq() { awk '/^cpu /{print $8}' /proc/stat; }
hz=$(getconf CLK_TCK)
scrape() { inn curl -sf "http://127.0.0.1:$PORT/metrics"; }
metric() { scrape | awk -v m="$1" 'index($0, m) == 1 {v = $NF} END {print v + 0}'; }
webflags='proxyhealth_conntrack_invalid_reason_packets_total{reason="tcp_flags",service_name="web",service_namespace="default"}'

phase() {
	kind=$1
	pid=
	if [ "$kind" != none ]; then
		rate=10000
		[ "$kind" = unbounded ] && rate=0
		ip netns exec "$node" taskset -c 0 "$EXPORTER" --web.listen-address=127.0.0.1:$PORT --no-collector.node \
			--no-collector.rules --no-collector.kubeproxy --conntrack.invalid-reasons \
			--conntrack.invalid-reasons.state-dir="$tmp/state" \
			--conntrack.invalid-reasons.max-rate=$rate >"$tmp/$kind.log" 2>&1 &
		pid=$!
		i=0
		until scrape 2>/dev/null | grep -q '^proxyhealth_conntrack_invalid_log_listened_seconds_total'; do
			i=$((i + 1)); [ $i -lt 100 ] || { echo "exporter not ready:" >&2; cat "$tmp/$kind.log" >&2; exit 1; }
			sleep 0.1
		done
		count0=$(metric "$webflags"); listen0=$(metric proxyhealth_conntrack_invalid_log_listened_seconds_total)
		cpu0=$(ticks "$pid")
	fi
	soft0=$(softirq); t0=$(date +%s.%N)
	sent=$(ip netns exec "$client" timeout -s INT "$DURATION" taskset -c 1 hping3 --flood -q -S -F -p 80 10.96.0.20 2>&1 |
		awk '/packets transmitted/ {print $1}')
	t1=$(date +%s.%N); soft1=$(softirq)
	if [ "$kind" != none ]; then
		cpu1=$(ticks "$pid")
		count1=$(metric "$webflags"); listen1=$(metric proxyhealth_conntrack_invalid_log_listened_seconds_total)
		kill "$pid"; wait "$pid" || true; pid=
		awk -v k="$kind" -v s="$sent" -v c="$((cpu1 - cpu0))" -v q="$((soft1 - soft0))" -v hz="$hz" \
			-v t0="$t0" -v t1="$t1" -v n="$((count1 - count0))" -v l0="$listen0" -v l1="$listen1" \
			'BEGIN {e = t1 - t0; printf "| %s | %d | %.1f | %.1f%% | %.1f%% | %d | %.2f |\n", k, s, e, 100*c/hz/e, 100*q/hz/e, n, l1 - l0}'
	else
		awk -v s="$sent" -v q="$((soft1 - soft0))" -v hz="$hz" -v t0="$t0" -v t1="$t1" \
			'BEGIN {e = t1 - t0; printf "| none | %d | %.1f | - | %.1f%% | - | - |\n", s, e, 100*q/hz/e}'
	fi
}

echo "| phase | packets sent | seconds | exporter CPU (one core) | node softirq (one core) | web tcp_flags counted | seconds listened |"
echo "|---|---|---|---|---|---|---|"
r=0
while [ $r -lt "$ROUNDS" ]; do
	if [ $((r % 2)) -eq 0 ]; then order="none unbounded bounded"; else order="bounded unbounded none"; fi
	for kind in $order; do phase "$kind"; done
	r=$((r + 1))
done
