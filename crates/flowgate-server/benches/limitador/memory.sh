#!/usr/bin/env bash
# Bytes per counter in a server's memory store: the server's resident set (VmRSS) after a
# small warm-up, then after REQUESTS requests drawn uniformly over KEYS values of `api_key`
# (the same limit as run.sh: domain `bench`, 10^9 per year, fixed window), divided by the
# expected number of distinct values drawn, KEYS × (1 − e^(−REQUESTS/KEYS)). The defaults
# give ≈ 999,800 counters.
#
#   crates/flowgate-server/benches/limitador/memory.sh                      # flowgate
#   SERVER=limitador LIMITADOR=/path/to/limitador-server …/memory.sh        # the peer
#
# Environment: SERVER (flowgate or limitador), FLOWGATE (target/release/flowgate; also the load
# generator), LIMITADOR, KEYS (1020000), REQUESTS (4000000), PORT (19400), OUT (a new temporary
# directory).
set -euo pipefail

FLOWGATE=${FLOWGATE:-target/release/flowgate}
SERVER=${SERVER:-flowgate}
KEYS=${KEYS:-1020000}
REQUESTS=${REQUESTS:-4000000}
PORT=${PORT:-19400}
LIMIT=1000000000
OUT=${OUT:-$(mktemp -d /tmp/flowgate-memory.XXXXXX)}
mkdir -p "$OUT"
die() { echo "memory.sh: $*" >&2; exit 1; }
[[ -x $FLOWGATE ]] || die "no flowgate binary at $FLOWGATE"

cat >"$OUT/flowgate.yaml" <<YAML
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: year, requests_per_unit: $LIMIT, algorithm: fixed_window}
YAML
cat >"$OUT/limitador.yaml" <<YAML
---
- namespace: bench
  max_value: $LIMIT
  seconds: 31536000
  conditions: []
  variables:
    - descriptors[0].api_key
YAML

http=$PORT grpc=$((PORT + 1))
case $SERVER in
  flowgate) cmd=("$FLOWGATE" serve --config "$OUT/flowgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc") ;;
  limitador)
    [[ -n ${LIMITADOR:-} && -x $LIMITADOR ]] || die "set LIMITADOR=/path/to/limitador-server"
    cmd=("$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 --http-port "$http" "$OUT/limitador.yaml" memory)
    ;;
  *) die "SERVER: flowgate or limitador" ;;
esac
env -u LIMITS_FILE -u REDIS_URL -u DISK_PATH taskset -c 0 "${cmd[@]}" >"$OUT/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  (exec 3<>"/dev/tcp/127.0.0.1/$grpc") 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || die "$SERVER exited at start; see $OUT/server.log"
  sleep 0.05
done
rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$pid/status"; }
lg=(taskset -c 1 "$FLOWGATE" loadgen --target "grpc://127.0.0.1:$grpc" --domain bench --key api_key --json)
"${lg[@]}" --keys 1000 --requests 20000 >/dev/null
before=$(rss)
"${lg[@]}" --keys "$KEYS" --requests "$REQUESTS" --seed 7 >"$OUT/load.json"
after=$(rss)
python3 - "$SERVER" "$before" "$after" "$KEYS" "$REQUESTS" "$OUT/load.json" <<'PY' | tee "$OUT/summary.txt"
import json, math, sys
server, before, after, keys, requests = sys.argv[1], *map(int, sys.argv[2:6])
load = json.load(open(sys.argv[6]))
counters = keys * (1 - math.exp(-requests / keys))
print(f"{server}: VmRSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB after {load['requests']:,} requests "
      f"({load['errors']} errors) over {keys:,} values (~{counters:,.0f} counters): "
      f"{(after - before) / counters:.1f} bytes per counter")
PY
