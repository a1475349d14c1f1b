#!/usr/bin/env bash
# RLQS cost (BENCHMARKS.md, "RLQS"): Flowgate's server CPU per enforced request when a fleet of
# Envoys enforces a rule through the Rate Limit Quota Service, against the same load through
# ShouldRateLimit (one call per request), same binary, same rule, same run; and the server's
# memory per (Envoy, bucket).
#
#   cargo build --release -p flowgate-server && crates/flowgate-server/benches/rlqs/cpu.sh
#
# The server is pinned to CPU 0 and the load generator to CPU 1 (`taskset`); server CPU time
# is read before and after each run from /proc/PID/task/*/schedstat (time on CPU, ns, summed
# over the server's threads): the RLQS side spends milliseconds, below /proc/PID/stat's ticks.
# Environment: BIN (flowgate binary), DURATION (per run, default 20s), ENVOYS (20),
# RATE_PER_ENVOY (1000 requests/s), MEMORY_ENVOYS (1000), MEMORY_KEYS (10 buckets each).
set -euo pipefail
BIN=${BIN:-target/release/flowgate}
DURATION=${DURATION:-20s}
ENVOYS=${ENVOYS:-20}
RATE_PER_ENVOY=${RATE_PER_ENVOY:-1000}
MEMORY_ENVOYS=${MEMORY_ENVOYS:-1000}
MEMORY_KEYS=${MEMORY_KEYS:-10}
RATE=$((ENVOYS * RATE_PER_ENVOY))
work=$(mktemp -d)
cat > "$work/bench.yaml" <<'YAML'
domain: bench
descriptors:
  # One limit per tenant, well above the offered load: every request is decided, none denied
  # for lack of capacity (the comparison is about what a decision costs).
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000}
rlqs:
  report_interval: 1s
  assignment_ttl: 3s
YAML

taskset -c 0 "$BIN" serve --config "$work/bench.yaml" --http 127.0.0.1:18180 --grpc 127.0.0.1:18181 \
  --rlqs-max-streams 20000 --no-dashboard 2>"$work/server.log" &
server=$!
trap 'kill $server 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18181) 2>/dev/null && break; sleep 0.1; done

cpu() { cat /proc/$server/task/*/schedstat | awk '{ns += $1} END {printf "%d\n", ns}'; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$server/status"; }

# ShouldRateLimit: one call per request, open loop at the fleet's rate, over as many
# connections as there are Envoys (each Envoy keeps one to its rate-limit cluster).
before=$(cpu)
taskset -c 1 "$BIN" loadgen --target grpc://127.0.0.1:18181 --domain bench --key tenant --keys 1 \
  --rate "$RATE" --concurrency 64 --connections "$ENVOYS" --threads 1 --duration "$DURATION" --json \
  > "$work/rls.json"
rls_cpu=$(( $(cpu) - before ))

# RLQS: the same Envoys enforcing the same rule themselves, reporting every second.
sleep 2
before=$(cpu)
taskset -c 1 "$BIN" loadgen --rlqs --target grpc://127.0.0.1:18181 --domain bench --key tenant --keys 1 \
  --rate "$RATE" --envoys "$ENVOYS" --zipf-exponent 0 --threads 1 --duration "$DURATION" --json \
  > "$work/rlqs.json"
rlqs_cpu=$(( $(cpu) - before ))

# Memory: MEMORY_ENVOYS Envoys with MEMORY_KEYS buckets each (10 requests/s per Envoy).
sleep 4
rss_before=$(rss)
taskset -c 1 "$BIN" loadgen --rlqs --target grpc://127.0.0.1:18181 --domain bench --key tenant \
  --keys "$MEMORY_KEYS" --rate $((MEMORY_ENVOYS * 10)) --envoys "$MEMORY_ENVOYS" --zipf-exponent 0 \
  --threads 1 --duration 15s --json > "$work/memory.json" &
loader=$!
sleep 12
rss_during=$(rss)
buckets=$(curl -s 127.0.0.1:18180/metrics | awk '/^flowgate_rlqs_buckets / {print $2}')
wait $loader

python3 - "$work" "$rls_cpu" "$rlqs_cpu" "$rss_before" "$rss_during" "$buckets" <<'PY'
import json, sys
work, rls_cpu, rlqs_cpu, rss0, rss1, buckets = sys.argv[1:]
rls = json.load(open(f"{work}/rls.json"))
rlqs = json.load(open(f"{work}/rlqs.json"))
rls_s, rlqs_s = int(rls_cpu) / 1e9, int(rlqs_cpu) / 1e9
rls_n, rlqs_n = rls["requests"], rlqs["requests"]
per_rls = 1e6 * rls_s / rls_n
per_rlqs = 1e6 * rlqs_s / rlqs_n
print(f"{'API':<16}{'enforced':>12}{'server CPU s':>14}{'us/request':>12}")
print(f"{'ShouldRateLimit':<16}{rls_n:>12,}{rls_s:>14.2f}{per_rls:>12.3f}   ({rls['throughput']:,.0f}/s, p99 {rls['latency_us']['p99']/1000:.2f} ms, errors {rls['errors']})")
print(f"{'RLQS':<16}{rlqs_n:>12,}{rlqs_s:>14.3f}{per_rlqs:>12.4f}   ({rlqs['reports']} reports, {rlqs['messages']} assignment messages)")
if per_rlqs > 0:
    print(f"RLQS: {per_rls / per_rlqs:,.0f}x less server CPU per enforced request")
else:
    print("RLQS: no server CPU time measured")
b = float(buckets or 0)
if b > 0:
    print(f"memory: {b:,.0f} (Envoy, bucket) pairs, RSS {int(rss0)/1024:.1f} -> {int(rss1)/1024:.1f} MiB: "
          f"{(int(rss1) - int(rss0)) * 1024 / b:,.0f} bytes per (Envoy, bucket)")
PY
