#!/usr/bin/env bash
# User-space instructions per request of the gateway and of nginx `limit_req`, on the same
# load: figures the machine's other tenants do not move (valgrind's callgrind counts every
# instruction the proxy executes, all threads).
#
#   crates/flowgate-server/benches/gateway/callgrind.sh
#   FLOWGATE=/tmp/flowgate-before crates/flowgate-server/benches/gateway/callgrind.sh
#
# Each proxy runs under `valgrind --tool=callgrind` (flowgate pinned to one core, so its
# runtime has one worker as in run.sh; nginx one worker, `master_process off`), twice per load:
# wrk for SHORT and for LONG seconds; the difference of the instruction totals over the
# difference of the request counts leaves shutdown out. Start-up is not counted at all:
# instrumentation is switched on (`callgrind_control -i on`) once the proxy answers, so a
# start-up loop that runs for a time, not a number of instructions (a clock's calibration),
# does not move the figures (the spread of three runs of one build went from ±360 to ±110).
# The upstream is nginx answering `ok` from memory (not measured). Loads, CONNECTIONS
# connections each (default 8):
#   pass     every request allowed and proxied (rule 10^8/s on the key `a`)
#   refused  every request over the limit (key `b`, 1 per minute): 429 without the upstream
#   mix      every other request refused, as run.sh's `-mix`
# Besides `flowgate` and `nginx`, two servers that answer `ok` themselves, for the floor under
# a proxy (a diagnosis, not a result; with LOADS=pass):
#   hyper-floor  hyper's HTTP/1 server configured as the gateway's (example `hyper_floor`)
#   nginx-floor  nginx, one worker, `return 200 "ok"`
#   PROXIES="hyper-floor nginx-floor" LOADS=pass crates/flowgate-server/benches/gateway/callgrind.sh
# Needs: valgrind, wrk, nginx. Prints one line per proxy and load; keeps the profiles in $OUT
# (callgrind_annotate them to see where the instructions go).
set -euo pipefail

SHORT=${SHORT:-4}
LONG=${LONG:-12}
CONNECTIONS=${CONNECTIONS:-8}
LOADS=${LOADS:-pass refused mix}
PROXIES=${PROXIES:-flowgate nginx}
UPSTREAM_PORT=${UPSTREAM_PORT:-18200}
PROXY_PORT=${PROXY_PORT:-18201}
ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/flowgate-gateway-callgrind.XXXXXX)}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${FLOWGATE:-}" ]; then
  FLOWGATE=$CARGO_TARGET_DIR/release/flowgate
  (cd "$ROOT" && cargo build --release -q -p flowgate-server)
fi
FLOOR=$CARGO_TARGET_DIR/release/examples/hyper_floor
case " $PROXIES " in
  *" hyper-floor "*) (cd "$ROOT" && cargo build --release -q -p flowgate-server --example hyper_floor) ;;
esac
for tool in valgrind wrk nginx; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y valgrind wrk nginx)" >&2; exit 1; }
done

cleanup() {
  [ -f "$OUT/upstream.pid" ] && kill "$(cat "$OUT/upstream.pid")" 2>/dev/null || true
  [ -n "${vg:-}" ] && kill "$vg" 2>/dev/null || true
}
trap cleanup EXIT

ok_server_conf() { # NAME PORT [HEAD]: nginx, one worker, answering `ok` from memory on PORT
  cat > "$OUT/$1.conf" <<CONF
${3:-}
worker_processes 1;
pid $OUT/$1.pid;
error_log $OUT/$1-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  server { listen 127.0.0.1:$2; location / { return 200 "ok"; } }
}
CONF
}
# The upstream (a daemon), and the floor beside the proxies (in the foreground, under callgrind).
ok_server_conf upstream "$UPSTREAM_PORT"
ok_server_conf floor "$PROXY_PORT" "daemon off; master_process off;"
nginx -c "$OUT/upstream.conf" -e "$OUT/upstream-error.log"

# The same limits as run.sh: nginx limit_req with both zones, flowgate with both rules.
cat > "$OUT/proxy.conf" <<CONF
daemon off;
master_process off;
worker_processes 1;
pid $OUT/proxy.pid;
error_log $OUT/proxy-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  map \$http_x_api_key \$strict_key { b \$http_x_api_key; default ""; }
  limit_req_zone \$http_x_api_key zone=per_key:10m rate=100000000r/s;
  limit_req_zone \$strict_key zone=strict:10m rate=1r/m;
  limit_req_status 429;
  limit_req_log_level warn;
  upstream up { server 127.0.0.1:$UPSTREAM_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$PROXY_PORT;
    location / {
      limit_req zone=per_key burst=100000000 nodelay;
      limit_req zone=strict;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
    }
  }
}
CONF
cat > "$OUT/flowgate.yaml" <<CONF
domain: bench
gateway:
  descriptors:
    - [{key: header, header: x-api-key, as: api_key}]
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 100000000, algorithm: gcra}
  - key: api_key
    value: b
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: gcra}
CONF
cat > "$OUT/mix.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["x-api-key"] = (n % 2 == 0) and "a" or "b" })
end
LUA

wait_port() {
  for _ in $(seq 1 600); do
    curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0
    sleep 0.1
  done
  echo "port $1 never answered" >&2
  exit 1
}
wait_port "$UPSTREAM_PORT"

start_proxy() { # NAME PROFILE: the proxy under callgrind, its pid in $vg
  case $1 in
    flowgate)
      RUST_LOG=warn taskset -c 0 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$2" \
        "$FLOWGATE" serve --config "$OUT/flowgate.yaml" --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
        --gateway "127.0.0.1:$PROXY_PORT" --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
        > /dev/null 2> "$2.log" &
      ;;
    nginx)
      valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$2" \
        nginx -c "$OUT/proxy.conf" -e "$OUT/proxy-error.log" > /dev/null 2> "$2.log" &
      ;;
    hyper-floor)
      taskset -c 0 valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$2" \
        "$FLOOR" "127.0.0.1:$PROXY_PORT" > /dev/null 2> "$2.log" &
      ;;
    nginx-floor)
      valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$2" \
        nginx -c "$OUT/floor.conf" -e "$OUT/floor-error.log" > /dev/null 2> "$2.log" &
      ;;
  esac
  vg=$!
}

for proxy in $PROXIES; do
  for load in $LOADS; do
    case $load in
      pass) args=(-H "x-api-key: a") ;;
      refused) args=(-H "x-api-key: b") ;;
      mix) args=(-s "$OUT/mix.lua") ;;
    esac
    : > "$OUT/$proxy.$load.counts"
    for secs in $SHORT $LONG; do
      profile=$OUT/$proxy.$load.$secs.cg
      start_proxy "$proxy" "$profile"
      wait_port "$PROXY_PORT"
      # Counting starts here, once the proxy serves (see the top).
      callgrind_control -i on "$vg" > /dev/null
      wrk -t1 -c"$CONNECTIONS" -d"${secs}s" "${args[@]}" "http://127.0.0.1:$PROXY_PORT/" \
        > "$OUT/$proxy.$load.$secs.wrk"
      kill -TERM "$vg"
      wait "$vg" 2>/dev/null || true
      vg=
      requests=$(grep -o '[0-9]* requests in' "$OUT/$proxy.$load.$secs.wrk" | awk '{print $1}')
      # (wait_port's probes are a few requests more in both runs: they cancel out.)
      instructions=$(grep -o 'Collected : [0-9]*' "$profile.log" | awk '{print $3}')
      echo "$requests $instructions" >> "$OUT/$proxy.$load.counts"
    done
    awk -v what="$proxy $load" 'NR==1 {n1=$1; i1=$2} NR==2 {n2=$1; i2=$2}
      END {printf "callgrind: %-14s %7.0f instructions per request (%d and %d requests)\n",
           what, (i2-i1)/(n2-n1), n1, n2}' "$OUT/$proxy.$load.counts"
  done
done
echo "profiles: $OUT" >&2
