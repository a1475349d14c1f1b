#!/usr/bin/env bash
# RLQS accuracy (BENCHMARKS.md, "RLQS"): a fleet of simulated Envoys (`flowgate loadgen
# --rlqs`) with Zipf demand against one rule of LIMIT per second, on two Flowgate instances
# sharing a redis-server; one Envoy leaves and one joins every CHURN; at KILL_AT the second
# instance is killed (SIGKILL) and its Envoys reconnect to the first. Prints the fleet's
# admitted requests per window against the limit.
#
#   cargo build --release -p flowgate-server && crates/flowgate-server/benches/rlqs/accuracy.sh
#
# Environment: BIN, ENVOYS (20), RATE (fleet demand, 2000/s), LIMIT (1000), ZIPF (1.0),
# DURATION (60s), CHURN (10s), KILL_AT (30 seconds after the start), REPORT (1s).
set -euo pipefail
BIN=${BIN:-target/release/flowgate}
ENVOYS=${ENVOYS:-20}
RATE=${RATE:-2000}
LIMIT=${LIMIT:-1000}
ZIPF=${ZIPF:-1.0}
DURATION=${DURATION:-60s}
CHURN=${CHURN:-10s}
KILL_AT=${KILL_AT:-30}
REPORT=${REPORT:-1s}
work=$(mktemp -d)
cat > "$work/fleet.yaml" <<YAML
domain: fleet
descriptors:
  - key: api
    rate_limit: {unit: second, requests_per_unit: $LIMIT}
rlqs:
  report_interval: $REPORT
  assignment_ttl: 3s
YAML
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
redis=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
serve() { # grpc-port http-port
  "$BIN" serve --config "$work/fleet.yaml" --grpc "127.0.0.1:$1" --http "127.0.0.1:$2" \
    --redis "redis://127.0.0.1:$port" --fail local --instances 2 --no-dashboard 2>>"$work/server.log" &
}
serve 18281 18280; one=$!
serve 18291 18290; two=$!
trap 'kill $one $two $redis 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for p in 18281 18291; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
done
( sleep "$KILL_AT"; kill -9 "$two"; echo "killed the second instance at ${KILL_AT}s" >&2 ) &
"$BIN" loadgen --rlqs --target grpc://127.0.0.1:18281,grpc://127.0.0.1:18291 --domain fleet \
  --key api --keys 1 --rate "$RATE" --envoys "$ENVOYS" --zipf-exponent "$ZIPF" --limit "$LIMIT" \
  --report-interval "$REPORT" --churn "$CHURN" --duration "$DURATION"
