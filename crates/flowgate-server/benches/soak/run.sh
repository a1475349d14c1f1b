#!/usr/bin/env bash
# Soak: one `flowgate serve` counting in Redis, with the WebSocket gateway on, held for a long
# time under steady load (RELIABILITY.md, "Soak"):
#
#   crates/flowgate-server/benches/soak/run.sh [MINUTES] [OUT_DIR]      # default 30, /tmp/soak
#
# 1. capacity: `flowgate loadgen` closed loop against the gRPC API for 10 s (1,000 keys);
# 2. soak: MINUTES one-minute segments, back to back, each at half that capacity
#    (`loadgen --rate`, open loop, latency from the scheduled send time) while 1,000 WebSocket
#    connections through the gateway each send a message every 2 s (`ws_bench load`, 500
#    messages/s in all) to an echo server;
# 3. every segment records: the segment's decisions/s, p50/p99/max latency and errors (gRPC),
#    the WebSocket messages/s and p99, the server's RSS, open file descriptors and threads,
#    and Redis's used memory and key count, into OUT_DIR/soak.csv;
# 4. OUT_DIR/soak.svg charts them (python3 with matplotlib; skipped if it is missing).
#
# A private redis-server on a free port (never the machine's 6379), ports 19901-19905 on
# 127.0.0.1. NO_BUILD=1 uses the binaries already built (target/release). Every loop is
# bounded by MINUTES.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
MINUTES=${1:-30}
OUT=${2:-/tmp/soak}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p flowgate-server --bin flowgate --example ws_bench >&2
BIN=$CARGO_TARGET_DIR/release
REDIS=19901 ECHO=19902 WS=19903 HTTP=19904 GRPC=19905
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
wait_port() {
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    exit 1
}
cat > "$TMP/soak.yaml" <<YAML
domain: soak
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000}
websocket:
  upstream: ws://127.0.0.1:$ECHO
  limits:
    messages: {limit: 100, per: 1s}
YAML

redis-server --port $REDIS --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" \
    >"$TMP/redis.log" 2>&1 & PIDS+=($!)
THREADS=1 "$BIN/examples/ws_bench" echo "127.0.0.1:$ECHO" & PIDS+=($!)
wait_port $REDIS; wait_port $ECHO
RUST_LOG=warn "$BIN/flowgate" serve --config "$TMP/soak.yaml" --redis "redis://127.0.0.1:$REDIS" \
    --http "127.0.0.1:$HTTP" --grpc "127.0.0.1:$GRPC" --websocket "127.0.0.1:$WS" \
    --drain-period 0s 2>"$OUT/server.log" & SERVER=$!; PIDS+=($SERVER)
wait_port $GRPC; wait_port $WS

loadgen() {
    "$BIN/flowgate" loadgen --target "grpc://127.0.0.1:$GRPC" --domain soak --key api_key \
        --keys 1000 --json "$@"
}
field() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores); $(date -u +%FT%TZ)"
capacity=$(loadgen --duration 10s | field 'round(d["throughput"])')
rate=$(( capacity / 2 ))
echo "# capacity ${capacity} decisions/s (closed loop, 64 callers); soaking at ${rate}/s for ${MINUTES} min"
echo "minute,decisions_per_s,p50_us,p99_us,max_us,errors,ws_messages_per_s,ws_p99_us,rss_kib,fds,threads,redis_used_memory,redis_keys" > "$OUT/soak.csv"
for minute in $(seq 1 "$MINUTES"); do
    "$BIN/examples/ws_bench" load "ws://127.0.0.1:$WS/" 1000 59 64 500 > "$TMP/ws.out" 2>&1 &
    ws=$!
    grpc=$(loadgen --duration 60s --rate "$rate" --concurrency 64 \
        | field '",".join(str(x) for x in [round(d["throughput"]), d["latency_us"]["p50"], d["latency_us"]["p99"], d["latency_us"]["max"], d["errors"]])')
    wait $ws || true
    ws_rate=$(sed -n 's/.*rate=\([0-9.]*\).*/\1/p' "$TMP/ws.out" | head -1)
    ws_p99=$(sed -n 's/.*p99_us=\([0-9]*\).*/\1/p' "$TMP/ws.out" | head -1)
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$SERVER/status")
    fds=$(ls "/proc/$SERVER/fd" | wc -l)
    threads=$(awk '/^Threads/ {print $2}' "/proc/$SERVER/status")
    used=$(redis-cli -p $REDIS info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p')
    keys=$(redis-cli -p $REDIS dbsize)
    line="$minute,$grpc,${ws_rate:-0},${ws_p99:-0},$rss,$fds,$threads,$used,$keys"
    echo "$line" | tee -a "$OUT/soak.csv"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
kill -0 "$SERVER" && echo "# server still running"
grep -c -E "ERROR|panicked" "$OUT/server.log" | sed 's/^/# error lines in the server log: /' || true

if python3 -c "import matplotlib" 2>/dev/null; then
python3 - "$OUT" <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
rows = list(csv.DictReader(open(f"{out}/soak.csv")))
m = [int(r["minute"]) for r in rows]
col = lambda k: [float(r[k]) for r in rows]
fig, ax = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
ax[0].plot(m, col("decisions_per_s"), label="gRPC decisions/s")
ax[0].plot(m, col("ws_messages_per_s"), label="WebSocket messages/s")
ax[0].set_ylabel("per second"); ax[0].legend(); ax[0].set_ylim(bottom=0)
ax[1].plot(m, [v / 1000 for v in col("p99_us")], label="gRPC p99")
ax[1].plot(m, [v / 1000 for v in col("ws_p99_us")], label="WebSocket p99")
ax[1].set_ylabel("ms"); ax[1].legend(); ax[1].set_ylim(bottom=0)
ax[2].plot(m, [v / 1024 for v in col("rss_kib")], label="server RSS (MiB)")
ax[2].plot(m, [v / 1048576 for v in col("redis_used_memory")], label="Redis used memory (MiB)")
ax[2].set_ylabel("MiB"); ax[2].legend(); ax[2].set_ylim(bottom=0)
ax[3].plot(m, col("fds"), label="server file descriptors")
ax[3].plot(m, col("errors"), label="gRPC errors per minute")
ax[3].set_ylabel("count"); ax[3].legend(); ax[3].set_ylim(bottom=0)
ax[3].set_xlabel("minute")
fig.suptitle("flowgate serve --redis, soak at half capacity + 1,000 WebSocket connections")
fig.tight_layout()
fig.savefig(f"{out}/soak.svg")
fig.savefig(f"{out}/soak.png", dpi=80)
print(f"# chart: {out}/soak.svg")
PY
else
    echo "# no matplotlib (pip install matplotlib): no chart"
fi
