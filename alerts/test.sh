#!/usr/bin/env bash
# Checks the alert rules: promtool check rules, the promtool unit tests in alerts/tests/, and
# promtool check metrics on a real scrape of the exporter. The scrape runs the built exporter
# briefly in a network namespace of its own (root only; skipped otherwise), removed afterwards.
# promtool comes with Debian's `prometheus` package.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null; then
	echo "promtool not found; install: apt-get install -y prometheus" >&2
	exit 1
fi

promtool check rules alerts/proxyhealth.rules.yml
promtool test rules alerts/tests/*.test.yml

# Every alert has a unit test.
missing=0
for alert in $(sed -n 's/^ *- alert: *//p' alerts/proxyhealth.rules.yml); do
	if ! grep -q "alertname: $alert\$" alerts/tests/*.test.yml; then
		echo "alert $alert has no promtool test in alerts/tests/" >&2
		missing=1
	fi
done
# Every runbook_url points at a section of docs/runbooks.md that exists.
for anchor in $(sed -n 's/^ *runbook_url: .*docs\/runbooks\.md#//p' alerts/proxyhealth.rules.yml); do
	if ! grep -qix "## $anchor" docs/runbooks.md; then
		echo "runbook_url #$anchor: no such section (## heading) in docs/runbooks.md" >&2
		missing=1
	fi
done
((missing == 0)) || exit 1

if (($(id -u) != 0)); then
	echo "skipping promtool check metrics on a live scrape: needs root (a network namespace)"
	exit 0
fi

tmp=$(mktemp -d)
ns="ph-alerts-$$"
pid=""
cleanup() {
	if [[ -n "$pid" ]]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	ip netns del "$ns" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/proxyhealth" .
ip netns add "$ns"
ip -n "$ns" link set lo up
ip netns exec "$ns" "$tmp/proxyhealth" --web.listen-address=127.0.0.1:9869 >"$tmp/exporter.log" 2>&1 &
pid=$!

# Scrape over bash's /dev/tcp inside the namespace (no curl needed), headers stripped.
scrape() {
	ip netns exec "$ns" bash -c 'exec 3<>/dev/tcp/127.0.0.1/9869 &&
		printf "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3 && cat <&3' 2>/dev/null |
		sed '1,/^\r\{0,1\}$/d'
}
body=""
for _ in $(seq 50); do
	body=$(scrape || true)
	[[ "$body" == *proxyhealth_build_info* ]] && break
	sleep 0.2
done
if [[ "$body" != *proxyhealth_build_info* ]]; then
	echo "the exporter did not answer a scrape; its log:" >&2
	cat "$tmp/exporter.log" >&2
	exit 1
fi
echo "promtool check metrics on a live scrape ($(grep -c '^proxyhealth_' <<<"$body") proxyhealth_ samples)"
printf '%s\n' "$body" | promtool check metrics
