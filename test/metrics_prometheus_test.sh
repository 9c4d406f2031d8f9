#!/usr/bin/env bash
# Metrics as an operator meets them: echo_server --metrics-listen serves a text exposition that
# promtool accepts, and a real Prometheus server (Debian's prometheus package) scrapes it and
# answers a query with the calls this test made.
set -euo pipefail
echo_server=examples/echo/echo_server
echo_client=examples/echo/echo_client
for tool in promtool prometheus curl python3; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (tools/setup.sh installs it)"; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# wait_for FILE PATTERN: until FILE has a line matching PATTERN (20 s).
wait_for() {
  for _ in $(seq 200); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: no '$2' in $1:"; cat "$1"; exit 1
}

"$echo_server" --listen tcp://127.0.0.1:0 --metrics-listen 127.0.0.1:0 >"$tmp/server.log" 2>&1 &
pids+=($!)
wait_for "$tmp/server.log" '^metrics on '
target=$(sed -n 's/^listening on //p' "$tmp/server.log")
url=$(sed -n 's/^metrics on //p' "$tmp/server.log")
metrics_addr=${url#http://}
metrics_addr=${metrics_addr%/metrics}

"$echo_client" --target "$target" --count 50 >/dev/null
"$echo_client" --target "$target" --chat >/dev/null

# 1. The exposition passes promtool's checks (format and naming conventions).
curl -sf "$url" >"$tmp/metrics.txt"
if ! out=$(promtool check metrics <"$tmp/metrics.txt" 2>&1) || [ -n "$out" ]; then
  echo "FAIL: promtool check metrics: $out"
  exit 1
fi
grep -q '^rdmarpc_server_handled_total{method="/demo.Echo/Say",code="OK"} 50$' "$tmp/metrics.txt" ||
  { echo "FAIL: the exposition does not count the 50 calls:"; cat "$tmp/metrics.txt"; exit 1; }
echo "ok: promtool check metrics accepts $(grep -vc '^#' "$tmp/metrics.txt") samples"

# 2. Prometheus scrapes it every second; its query API then answers with our counts.
prom_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$tmp/prometheus.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: rdmarpc
    static_configs:
      - targets: ['$metrics_addr']
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

query() {
  curl -sf "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1" |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "none")'
}
got=none
for _ in $(seq 60); do
  got=$(query 'rdmarpc_server_handled_total{job="rdmarpc",method="/demo.Echo/Say",code="OK"}' 2>/dev/null || echo none)
  [ "$got" = 50 ] && break
  sleep 1
done
if [ "$got" != 50 ]; then
  echo "FAIL: Prometheus answered '$got', want 50. Its log:"
  tail -20 "$tmp/prometheus.log"
  exit 1
fi
up=$(query 'up{job="rdmarpc"}')
count=$(query 'rdmarpc_server_handling_seconds_count{method="/demo.Echo/Chat"}')
[ "$up" = 1 ] && [ "$count" = 1 ] || { echo "FAIL: up=$up, Chat histogram count=$count"; exit 1; }
echo "ok: Prometheus scraped $metrics_addr: up=1, /demo.Echo/Say OK=50, Chat count=1"
