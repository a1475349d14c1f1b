#!/usr/bin/env bash
# The WebSocket gateway against a direct connection to the same upstream echo server and
# against nginx proxying WebSocket to it, on loopback: messages per second (closed loop: each
# connection sends and waits for its echo), added p50/p99 latency below saturation (a fixed
# total rate), at 100 and 1,000 connections; then the gateway's memory per idle proxied
# connection at 10,000 connections (RSS delta).
#
#   crates/flowgate-server/benches/websocket/run.sh [SECONDS_PER_RUN]
#
# ROUNDS=N (default 1) repeats the saturated runs, alternating direct, gateway and nginx in
# each round, and prints medians and ratios at the end (python3).
#
# nginx (apt-get install -y nginx; NGINX=path picks another binary) is the proxy a user would
# put in the gateway's place: one worker process, `proxy_pass` with the Upgrade and Connection
# fields, no rate limit (nginx has none for WebSocket messages) — it relays bytes, it parses no
# frame. Without nginx its arm is skipped, loudly.
#
# With CALLGRIND=1, also the instructions per round trip of the echo server alone, of the
# gateway alone and of nginx alone (valgrind's callgrind; figures the machine's load does not
# move); CALLGRIND_ONLY=1 runs only that.
#
# The gateway judges every message (messages and bytes per connection, the size limit), all
# allowing. Ports 19801-19805 on 127.0.0.1. Note the machine's load (printed before and
# after): on a shared 2-core machine wall-clock figures move by ±30 %.
#
# PIN=1 gives the proxy a core of its own, as it has in a deployment: the gateway (and nginx)
# run on core GATEWAY_CPU (default 0), the echo server and the load client on PEERS_CPU
# (default 1) in every run, so the upstream and the client have the same CPU either way and
# the ratio says whether the proxy keeps up with them. Each saturated line then also gives
# how the proxy's core spent its time (user, system, softirq; from /proc/stat): a relay's
# two reads and two writes per round trip cost the kernel the same whoever proxies.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
SECS=${1:-5}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# NO_BUILD=1 uses the binaries already built.
[ "${NO_BUILD:-0}" = 1 ] || cargo build --release -p flowgate-server --bin flowgate --example ws_bench >&2
BIN=$CARGO_TARGET_DIR/release
ECHO=19801 GW=19802 HTTP=19803 GRPC=19804 NGX=19805
ROUNDS=${ROUNDS:-1}
NGINX=${NGINX:-$(command -v nginx || true)}
# 10,000 idle connections take 20,000 descriptors in the gateway.
ulimit -Hn 65536 2>/dev/null || true
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
IDLE_N=10000
if [ "$(ulimit -n)" -lt 20500 ]; then
    IDLE_N=$(( ($(ulimit -n) - 500) / 2 ))
    echo "# only $(ulimit -n) file descriptors: $IDLE_N idle connections instead of 10,000"
fi
TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
cat > "$TMP/bench.yaml" <<YAML
domain: bench
websocket:
  upstream: ws://127.0.0.1:$ECHO
  limits:
    messages: {limit: 1000000, per: 1s}
    bytes: {limit: 1000000000, per: 1s}
    max_message_size: 65536
YAML
wait_port() {
    for _ in $(seq 600); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "port $1 never opened" >&2
    exit 1
}
GW_PIN=() PEER_PIN=()
if [ "${PIN:-0}" = 1 ]; then
    GW_PIN=(taskset -c "${GATEWAY_CPU:-0}")
    PEER_PIN=(taskset -c "${PEERS_CPU:-1}")
    echo "# pinned: gateway on core ${GATEWAY_CPU:-0}; echo server and load client on core ${PEERS_CPU:-1}"
fi
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
THREADS=1 "${PEER_PIN[@]}" "$BIN/examples/ws_bench" echo "127.0.0.1:$ECHO" & PIDS+=($!)
RUST_LOG=warn "${GW_PIN[@]}" "$BIN/flowgate" serve --config "$TMP/bench.yaml" --http "127.0.0.1:$HTTP" \
    --grpc "127.0.0.1:$GRPC" --websocket "127.0.0.1:$GW" & GWPID=$!; PIDS+=($GWPID)
TARGETS=(direct gateway)
if [ -n "$NGINX" ] && [ -x "$NGINX" ]; then
    cat > "$TMP/nginx.conf" <<CONF
worker_processes 1;
daemon off;
master_process off;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log warn;
events { worker_connections 20000; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$NGX;
    location / {
      proxy_pass http://127.0.0.1:$ECHO;
      proxy_http_version 1.1;
      proxy_set_header Upgrade \$http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_read_timeout 600s;
    }
  }
}
CONF
    "${GW_PIN[@]}" "$NGINX" -c "$TMP/nginx.conf" -e "$TMP/nginx-error.log" & PIDS+=($!)
    TARGETS+=(nginx)
else
    echo "# SKIPPED: nginx not found (apt-get install -y nginx, or NGINX=path): no nginx arm"
fi
wait_port $ECHO; wait_port $GW
[ "${TARGETS[2]:-}" = nginx ] && wait_port $NGX
port_of() { case $1 in direct) echo $ECHO ;; gateway) echo $GW ;; nginx) echo $NGX ;; esac; }
# user, system, softirq and idle ticks of the proxy's core
cpu_ticks() { awk -v cpu="cpu${GATEWAY_CPU:-0}" '$1 == cpu {print $2+$3, $4, $7+$8, $5+$6}' /proc/stat; }

if [ "${CALLGRIND_ONLY:-0}" != 1 ]; then
for conns in 100 1000; do
    for round in $(seq "$ROUNDS"); do
        for target in "${TARGETS[@]}"; do
            before=$(cpu_ticks)
            out=$("${PEER_PIN[@]}" "$BIN/examples/ws_bench" load "ws://127.0.0.1:$(port_of $target)/" $conns "$SECS" 64)
            split=""
            if [ "${PIN:-0}" = 1 ] && [ $target != direct ]; then
                split=$(echo "$before $(cpu_ticks)" | awk '{u=$5-$1; s=$6-$2; q=$7-$3; i=$8-$4; t=u+s+q+i;
                    printf " proxy_core: user=%.0f%% system=%.0f%% softirq=%.0f%% idle=%.0f%%", 100*u/t, 100*s/t, 100*q/t, 100*i/t}')
            fi
            echo "saturated conns=$conns $target round=$round $out$split" | tee -a "$TMP/saturated"
        done
    done
    # Below saturation: a fixed total rate both ways.
    rate=5000
    for target in "${TARGETS[@]}"; do
        out=$("${PEER_PIN[@]}" "$BIN/examples/ws_bench" load "ws://127.0.0.1:$(port_of $target)/" $conns "$SECS" 64 $rate)
        echo "paced rate=$rate/s conns=$conns $target $out"
    done
done
# Medians of the saturated rounds, and the ratios a reader compares.
python3 - "$TMP/saturated" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    conns, target = re.search(r"conns=(\d+) (\w+)", line).groups()
    rate = float(re.search(r"rate=([\d.]+)/s", line).group(1))
    p99 = int(re.search(r"p99_us=(\d+)", line).group(1))
    runs.setdefault((int(conns), target), []).append((rate, p99))
for conns in sorted({c for c, _ in runs}):
    m = {t: [statistics.median(col) for col in zip(*runs[(c, t)])] for c, t in runs if c == conns}
    line = (f"median conns={conns}: direct {m['direct'][0]:.0f} msg/s (p99 {m['direct'][1]:.0f} us), "
            f"gateway {m['gateway'][0]:.0f} (p99 {m['gateway'][1]:.0f} us)")
    if "nginx" in m:
        line += (f", nginx {m['nginx'][0]:.0f} (p99 {m['nginx'][1]:.0f} us); "
                 f"gateway/direct {m['gateway'][0] / m['direct'][0]:.2f}x, "
                 f"gateway/nginx {m['gateway'][0] / m['nginx'][0]:.2f}x, "
                 f"nginx/direct {m['nginx'][0] / m['direct'][0]:.2f}x")
    else:
        line += f"; gateway/direct {m['gateway'][0] / m['direct'][0]:.2f}x"
    print(line)
PY

# Memory: a fresh gateway, so that nothing earlier runs left in its allocator counts.
kill $GWPID; wait $GWPID 2>/dev/null || true
RUST_LOG=warn "$BIN/flowgate" serve --config "$TMP/bench.yaml" --http "127.0.0.1:$HTTP" \
    --grpc "127.0.0.1:$GRPC" --websocket "127.0.0.1:$GW" & GWPID=$!; PIDS+=($GWPID)
wait_port $GW
before=$(rss_kib $GWPID)
"$BIN/examples/ws_bench" idle "ws://127.0.0.1:$GW/" $IDLE_N 20 > "$TMP/idle.out" & IDLE=$!; PIDS+=($IDLE)
for _ in $(seq 600); do grep -q ready "$TMP/idle.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$TMP/idle.out" || { echo "the idle connections never opened" >&2; exit 1; }
sleep 2
after=$(rss_kib $GWPID)
relays=$(curl -s "http://127.0.0.1:$HTTP/metrics" | awk '/^flowgate_ws_relays / {print $2}')
echo "idle: relays=$relays gateway RSS ${before} KiB -> ${after} KiB: $(( (after - before) * 1024 / IDLE_N )) bytes per idle proxied connection"
kill $IDLE 2>/dev/null || true
wait $IDLE 2>/dev/null || true
fi

if [ "${CALLGRIND:-0}" = 1 ] || [ "${CALLGRIND_ONLY:-0}" = 1 ]; then
    # Instructions per message, which the machine's load does not move: the echo server
    # alone, and the gateway alone, each under callgrind for two runs of different lengths
    # (10 connections, closed loop), counted once the server answers; the difference of the
    # totals over the difference of the message counts leaves shutdown out.
    kill $GWPID; wait $GWPID 2>/dev/null || true
    measure() { # NAME PORT COMMAND...: appends "messages instructions" for runs of 3 s and 9 s
        local name=$1 port=$2; shift 2
        local url="ws://127.0.0.1:$port/"
        for secs in 3 9; do
            valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$TMP/$name.$secs.cg" "$@" \
                > /dev/null 2> "$TMP/$name.$secs.log" & local vg=$!
            wait_port "$port"
            # Counted from here: start-up (a clock's calibration loop runs for a time, not a
            # number of instructions) stays out of the totals.
            callgrind_control -i on "$vg" > /dev/null
            "$BIN/examples/ws_bench" load "$url" 10 $secs 64 > "$TMP/$name.$secs.out"
            kill -TERM $vg; wait $vg 2>/dev/null || true
            local n ir
            n=$(sed 's/.*messages=\([0-9]*\).*/\1/' "$TMP/$name.$secs.out")
            ir=$(grep -o 'Collected : [0-9]*' "$TMP/$name.$secs.log" | awk '{print $3}')
            echo "$n $ir" >> "$TMP/$name.counts"
        done
        awk -v what="$name" 'NR==1 {n1=$1; i1=$2} NR==2 {n2=$1; i2=$2}
            END {printf "callgrind: %s %d instructions per round trip (%d and %d round trips)\n", what, (i2-i1)/(n2-n1), n1, n2}' \
            "$TMP/$name.counts"
    }
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true
    PIDS=()
    export THREADS=1   # the echo server's workers (valgrind would profile `env`, not it)
    measure echo $ECHO "$BIN/examples/ws_bench" echo "127.0.0.1:$ECHO"
    "$BIN/examples/ws_bench" echo "127.0.0.1:$ECHO" & PIDS+=($!)
    wait_port $ECHO
    measure gateway $GW "$BIN/flowgate" serve --config "$TMP/bench.yaml" --http "127.0.0.1:$HTTP" \
        --grpc "127.0.0.1:$GRPC" --websocket "127.0.0.1:$GW"
    # nginx relaying the same load (one process: `master_process off`), for the user-space
    # budget the peer a user would pick lives in.
    if [ "${TARGETS[2]:-}" = nginx ]; then
        measure nginx $NGX "$NGINX" -c "$TMP/nginx.conf" -e "$TMP/nginx-error.log"
    fi
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
