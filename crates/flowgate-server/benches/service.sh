#!/usr/bin/env bash
# Service benchmark (BENCHMARKS.md, "Service"): decisions/s and p99 of ShouldRateLimit (gRPC)
# and POST /v1/check on the in-memory store, against the no-op baseline on the same stack
# (`flowgate serve --noop`: same binary, same protocols, same request parsing and response
# shape, no rule matching, counting or metrics). Rounds alternate real and no-op runs; the
# summary gives the median of the rounds.
#
#   cargo build --release -p flowgate-server && crates/flowgate-server/benches/service.sh
#
# Environment: BIN (flowgate binary), DURATION (per run, default 10s), CONCURRENCY (64),
# KEYS (10000 distinct values, uniform), ROUNDS (3).
set -euo pipefail
BIN=${BIN:-target/release/flowgate}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-64}
KEYS=${KEYS:-10000}
ROUNDS=${ROUNDS:-3}
work=$(mktemp -d)
cat > "$work/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000000}
YAML

"$BIN" serve --config "$work/bench.yaml" --http 127.0.0.1:18080 --grpc 127.0.0.1:18081 2>"$work/real.log" &
real=$!
"$BIN" serve --noop --config "$work/bench.yaml" --http 127.0.0.1:18090 --grpc 127.0.0.1:18091 2>"$work/noop.log" &
noop=$!
trap 'kill $real $noop 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for port in 18080 18090; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done

run() { # name target
  "$BIN" loadgen --target "$2" --domain bench --key user --keys "$KEYS" \
    --concurrency "$CONCURRENCY" --duration "$DURATION" --json > "$work/$1.$round.json"
}
for round in $(seq "$ROUNDS"); do
  run grpc grpc://127.0.0.1:18081
  run grpc-noop grpc://127.0.0.1:18091
  run check http://127.0.0.1:18080/v1/check
  run check-noop http://127.0.0.1:18090/v1/check
done

python3 - "$work" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.load(open(f"{work}/{name}.{r}.json")) for r in range(1, rounds + 1)]
def med(runs, f):
    return statistics.median(f(r) for r in runs)
print(f"{'endpoint':<22}{'decisions/s':>14}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'errors':>8}   runs (decisions/s)")
rows = {}
for name in ["grpc", "grpc-noop", "check", "check-noop"]:
    runs = load(name)
    rows[name] = med(runs, lambda r: r["throughput"])
    print(f"{name:<22}{rows[name]:>14,.0f}{med(runs, lambda r: r['latency_us']['p50'])/1000:>9.3f}"
          f"{med(runs, lambda r: r['latency_us']['p99'])/1000:>9.3f}{med(runs, lambda r: r['latency_us']['p999'])/1000:>10.3f}"
          f"{sum(r['errors'] for r in runs):>8}   " + ", ".join(f"{r['throughput']:,.0f}" for r in runs))
for name in ["grpc", "check"]:
    print(f"{name}: {100 * rows[name] / rows[name + '-noop']:.0f} % of the no-op endpoint")
PY
