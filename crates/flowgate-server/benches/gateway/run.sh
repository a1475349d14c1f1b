#!/usr/bin/env bash
# The gateway against nginx `limit_req`, side by side in one run, on loopback.
#
#   crates/flowgate-server/benches/gateway/run.sh            # 3 rounds of 10 s per scenario
#   ROUNDS=5 DURATION=20s CONNECTIONS=64 crates/flowgate-server/benches/gateway/run.sh
#   BASELINE=/tmp/flowgate-before crates/flowgate-server/benches/gateway/run.sh
#
# FLOWGATE=path runs that binary instead of building one; BASELINE=path runs a second flowgate
# binary (e.g. built from an earlier commit) as the `baseline*` scenarios of the same run, on
# BASELINE_PORT, so a change is compared before/after under the same conditions.
#
# Scenarios, interleaved round by round (so drift hits all alike):
#   direct        wrk -> upstream                       (the floor: what proxying adds to)
#   flowgate      wrk -> flowgate gateway -> upstream   (limits high enough to pass everything)
#   flowgate-mix  same, every other request with an over-limit API key (~50 % answered 429)
#   nginx         wrk -> nginx limit_req -> upstream    (same limits, same upstream keepalive)
#   nginx-mix     same mix
#   *-c4          direct, flowgate and nginx again with 4 connections instead of 32: latency
#                 when requests do not queue (the "added p99" to quote; at 32 connections
#                 every scenario saturates its core and p99 is mostly queueing)
# The upstream is nginx answering `ok` from memory. CPU split (taskset): the proxy under test
# on CORE_PROXY, wrk and the upstream on CORE_LOAD, so both proxies get exactly one core
# (flowgate's tokio runtime then runs one worker; nginx runs one worker process).
#
# Needs: wrk, nginx (apt-get install -y wrk nginx), a release build of flowgate (built here).
# The same loads' user-space instructions per request, which other tenants do not move:
# callgrind.sh beside this script.
# Prints a markdown table of medians (req/s, p50, p99, non-2xx share) and keeps the raw wrk
# output in $OUT.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNECTIONS=${CONNECTIONS:-32}
LAT_CONNECTIONS=${LAT_CONNECTIONS:-4}
CORE_PROXY=${CORE_PROXY:-0}
CORE_LOAD=${CORE_LOAD:-1}
UPSTREAM_PORT=${UPSTREAM_PORT:-18100}
FLOWGATE_PORT=${FLOWGATE_PORT:-18101}
NGINX_PORT=${NGINX_PORT:-18102}
BASELINE_PORT=${BASELINE_PORT:-18103}
BASELINE=${BASELINE:-}

ROOT=$(cd "$(dirname "$0")/../../../.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/flowgate-gateway-bench.XXXXXX)}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
if [ -z "${FLOWGATE:-}" ]; then
  FLOWGATE=$CARGO_TARGET_DIR/release/flowgate
  (cd "$ROOT" && cargo build --release -q -p flowgate-server)
fi

for tool in wrk nginx taskset; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y wrk nginx)" >&2; exit 1; }
done

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for conf in upstream proxy; do
    [ -f "$OUT/$conf.pid" ] && kill "$(cat "$OUT/$conf.pid")" 2>/dev/null || true
  done
}
trap cleanup EXIT

# --- the upstream: nginx, one worker, `ok` from memory ---------------------------------------
cat > "$OUT/upstream.conf" <<CONF
worker_processes 1;
pid $OUT/upstream.pid;
error_log $OUT/upstream-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$UPSTREAM_PORT;
    location / { return 200 "ok"; }
  }
}
CONF
taskset -c "$CORE_LOAD" nginx -c "$OUT/upstream.conf" -e "$OUT/upstream-error.log"

# --- nginx limit_req as the proxy: key `b` limited to 1 per minute, everyone else to a rate
# that never binds (both limits checked on every request); keep-alive to the upstream ---------
cat > "$OUT/proxy.conf" <<CONF
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
  # Rejections are logged at warn, below the error log's level: Flowgate does not log each
  # 429 either (nginx's default would write a line per rejection).
  limit_req_log_level warn;
  upstream up { server 127.0.0.1:$UPSTREAM_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
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
taskset -c "$CORE_PROXY" nginx -c "$OUT/proxy.conf" -e "$OUT/proxy-error.log"

# --- flowgate: the same limits as descriptors --------------------------------------------------
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
# start_gateway BINARY PORT LOG: a flowgate gateway on the proxy's core; its pid in $started.
start_gateway() {
  RUST_LOG=warn taskset -c "$CORE_PROXY" "$1" serve --config "$OUT/flowgate.yaml" \
    --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
    --gateway "127.0.0.1:$2" --upstream "http://127.0.0.1:$UPSTREAM_PORT" \
    2> "$OUT/$3" &
  started=$!
  pids+=("$started")
}
start_gateway "$FLOWGATE" "$FLOWGATE_PORT" flowgate.log
FLOWGATE_PID=$started
ports=("$UPSTREAM_PORT" "$NGINX_PORT" "$FLOWGATE_PORT")
if [ -n "$BASELINE" ]; then
  start_gateway "$BASELINE" "$BASELINE_PORT" baseline.log
  BASELINE_PID=$started
  ports+=("$BASELINE_PORT")
fi

for port in "${ports[@]}"; do
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.1
  done
done

cat > "$OUT/mix.lua" <<'LUA'
-- Every other request carries the over-limit key `b`.
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["x-api-key"] = (n % 2 == 0) and "a" or "b" })
end
LUA

# CPU time (user and system, clock ticks) of processes, all threads: robust to the noise of a
# shared machine, unlike wall-clock throughput. The user part is the proxy's own code; the
# system part is mostly the kernel's socket work, which every proxy pays alike.
ticks() {
  local user=0 system=0 f fields
  for pid in "$@"; do
    for f in /proc/"$pid"/task/*/stat; do
      # A thread may end between the listing and the read (tokio's idle blocking threads).
      read -r -a fields < <(sed 's/.*) //' "$f" 2>/dev/null) || continue
      user=$((user + fields[11])) system=$((system + fields[12]))
    done
  done
  echo "$user $system"
}

run() { # scenario port round [wrk args...]
  local name=$1 port=$2 round=$3 connections=$CONNECTIONS proxy=()
  shift 3
  case $name in *-c4) connections=$LAT_CONNECTIONS ;; esac
  case $name in
    flowgate*) proxy=("$FLOWGATE_PID") ;;
    baseline*) proxy=("$BASELINE_PID") ;;
    nginx*) mapfile -t proxy < <(pgrep -P "$(cat "$OUT/proxy.pid")") ;;
    direct*) mapfile -t proxy < <(pgrep -P "$(cat "$OUT/upstream.pid")") ;;
  esac
  taskset -c "$CORE_LOAD" wrk -t1 -c"$connections" -d"$WARMUP" "$@" "http://127.0.0.1:$port/" >/dev/null
  local before after
  read -r -a before < <(ticks "${proxy[@]}")
  taskset -c "$CORE_LOAD" wrk -t1 -c"$connections" -d"$DURATION" --latency "$@" \
    "http://127.0.0.1:$port/" > "$OUT/$name.$round.txt"
  read -r -a after < <(ticks "${proxy[@]}")
  echo "$((after[0] - before[0])) $((after[1] - before[1])) $(getconf CLK_TCK)" > "$OUT/$name.$round.cpu"
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round/$ROUNDS (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  run direct "$UPSTREAM_PORT" "$round" -H "x-api-key: a"
  run flowgate "$FLOWGATE_PORT" "$round" -H "x-api-key: a"
  [ -n "$BASELINE" ] && run baseline "$BASELINE_PORT" "$round" -H "x-api-key: a"
  run nginx "$NGINX_PORT" "$round" -H "x-api-key: a"
  run flowgate-mix "$FLOWGATE_PORT" "$round" -s "$OUT/mix.lua"
  [ -n "$BASELINE" ] && run baseline-mix "$BASELINE_PORT" "$round" -s "$OUT/mix.lua"
  run nginx-mix "$NGINX_PORT" "$round" -s "$OUT/mix.lua"
  run direct-c4 "$UPSTREAM_PORT" "$round" -H "x-api-key: a"
  run flowgate-c4 "$FLOWGATE_PORT" "$round" -H "x-api-key: a"
  [ -n "$BASELINE" ] && run baseline-c4 "$BASELINE_PORT" "$round" -H "x-api-key: a"
  run nginx-c4 "$NGINX_PORT" "$round" -H "x-api-key: a"
done

# --- medians -----------------------------------------------------------------------------------
python3 - "$OUT" "$ROUNDS" "${BASELINE:+1}" <<'PY'
import re, statistics, sys
out, rounds, baseline = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
unit = {"us": 1e-3, "ms": 1.0, "s": 1e3}
def parse(path):
    text = open(path).read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    total = int(re.search(r"(\d+) requests in", text).group(1))
    non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", text)) else 0
    pct = {}
    for p, v, u in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", text, re.M):
        pct[p] = float(v) * unit[u]
    user, system, hz = map(int, open(path[:-4] + ".cpu").read().split())
    return (rps, pct["50"], pct["99"], non2xx / total, (user + system) / hz * 1e6 / total,
            user / hz * 1e6 / total)
rows = {}
names = ["direct", "flowgate", "baseline", "nginx", "flowgate-mix", "baseline-mix", "nginx-mix",
         "direct-c4", "flowgate-c4", "baseline-c4", "nginx-c4"]
for name in names if baseline else [n for n in names if not n.startswith("baseline")]:
    runs = [parse(f"{out}/{name}.{r}.txt") for r in range(1, rounds + 1)]
    rows[name] = [statistics.median(col) for col in zip(*runs)]
    rows[name].append([round(r[0]) for r in runs])
print(f"| scenario | req/s (median of {rounds}) | p50 ms | p99 ms | non-2xx | CPU µs/request* | of which user | runs (req/s) |")
print("|---|---|---|---|---|---|---|---|")
for name, (rps, p50, p99, bad, cpu, user, runs) in rows.items():
    print(f"| {name} | {rps:,.0f} | {p50:.3f} | {p99:.3f} | {bad:.0%} | {cpu:.1f} | {user:.1f} | {runs} |")
print("\n*CPU time of the proxy (for direct: of the upstream) per request, all threads, user + system;")
print(" the user part alone beside it (the rest is the kernel's socket work).")
print()
for fg, ng, direct in [("flowgate", "nginx", "direct"), ("flowgate-mix", "nginx-mix", "direct"),
                       ("flowgate-c4", "nginx-c4", "direct-c4")]:
    d = rows[direct]
    print(f"{fg} / {ng} throughput: {rows[fg][0] / rows[ng][0]:.2f}x; "
          f"p99 added vs {direct}: {fg} {rows[fg][2] - d[2]:+.3f} ms, {ng} {rows[ng][2] - d[2]:+.3f} ms")
if baseline:
    for fg, base in [("flowgate", "baseline"), ("flowgate-mix", "baseline-mix"),
                     ("flowgate-c4", "baseline-c4")]:
        print(f"{fg} / {base}: throughput {rows[fg][0] / rows[base][0]:.2f}x, "
              f"CPU per request {rows[fg][4] / rows[base][4]:.2f}x")
PY
echo
echo "load average before: $LOAD_BEFORE; after: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'))"
echo "raw wrk output: $OUT" >&2
