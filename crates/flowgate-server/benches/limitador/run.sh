#!/usr/bin/env bash
# Flowgate's gRPC service (Envoy RLS ShouldRateLimit) against Kuadrant's limitador-server, side
# by side on one machine (BENCHMARKS.md, "Service"). Both count in memory and enforce the same
# limit: domain `bench`, descriptor `api_key`, one counter per value, 10^9 per year, fixed
# window (limitador has only fixed windows; Flowgate is told `algorithm: fixed_window`).
#
#   LIMITADOR=/path/to/limitador-server crates/flowgate-server/benches/limitador/run.sh
#
# The peer is not built here: bring your own binary of it (its own release profile).
#
# Each server runs pinned to one core (`taskset -c $SERVER_CPU`), the load generator to the
# other (`taskset -c $LOAD_CPU`). Every round runs every scenario against every server, the
# servers' order rotating from round to round; a server's CPU is read from /proc/PID/stat
# (utime + stime, all threads) before and after each run, the load generator's from
# /usr/bin/time, and /proc/loadavg before and after; the servers not being measured are
# stopped (SIGSTOP) meanwhile. The summary gives medians over rounds.
#
# Scenarios (SCENARIOS):
#   allowed  `flowgate loadgen`, 64 callers (over its default 4 connections), 1,000 values of
#            `api_key` drawn uniformly, hits_addend 1: nothing is denied.
#   half     the same, but half of the requests (a seeded draw) ask for hits_addend 10^9, the
#            whole limit: every value has been hit before (warm-up), so those are denied by the
#            counter (not by an error) and consume nothing; the other half are allowed.
#   paced    `allowed` open-loop at a fixed offered rate (`loadgen --rate $RATE`, default
#            40,000/s, below what either server answers on one core): latencies at the same
#            load (measured from each request's scheduled send time, so queueing counts).
#   h2load   `h2load -c 8 -m 16` posting one prebuilt ShouldRateLimit request (value `k0`,
#            hits_addend 1): nothing denied. h2load cannot read gRPC trailers, so the script
#            checks once, through each server's metrics, that such a request is counted.
#
# Servers (SERVERS):
#   flowgate     `flowgate serve` (per-descriptor statuses and IETF RateLimit headers: always)
#   limitador    `limitador-server … memory` (no rate-limit headers: its default)
#   limitador-h  the same with `-H DRAFT_VERSION_03` (it returns X-RateLimit-* headers)
#   noop         `flowgate serve --noop` (same stack, answers without deciding: a diagnosis of
#                the stack and of the load generator, not a target)
#   flowgate-TAG `flowgate serve` from another binary, named in FLOWGATES="TAG=/path …" (e.g. builds
#                with other release profiles, measured in the same run)
#
# Environment: LIMITADOR (required when a limitador server is selected), FLOWGATE (default
# target/release/flowgate; also the load generator unless LOADGEN is set), H2LOAD (h2load),
# DURATION (seconds per run, 10), ROUNDS (3), SERVERS ("flowgate limitador limitador-h"),
# SCENARIOS ("allowed half h2load"; also "paced"), RATE (40000, for paced), CONCURRENCY (64),
# KEYS (1000), SERVER_CPU (0),
# LOAD_CPU (1), PORT_BASE (19100), OUT (directory for raw results; default a new temporary one,
# kept), EXTRA_LOADGEN (more flags for every loadgen run, e.g. "--connections 8"), FLOWGATES
# (more Flowgate binaries, "TAG=/path …"; add flowgate-TAG to SERVERS).
set -euo pipefail

FLOWGATE=${FLOWGATE:-target/release/flowgate}
LOADGEN=${LOADGEN:-$FLOWGATE}
H2LOAD=${H2LOAD:-h2load}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-3}
SERVERS=${SERVERS:-"flowgate limitador limitador-h"}
SCENARIOS=${SCENARIOS:-"allowed half h2load"}
CONCURRENCY=${CONCURRENCY:-64}
RATE=${RATE:-40000}
KEYS=${KEYS:-1000}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT_BASE=${PORT_BASE:-19100}
EXTRA_LOADGEN=${EXTRA_LOADGEN:-}
LIMIT=1000000000
OUT=${OUT:-$(mktemp -d /tmp/flowgate-vs-limitador.XXXXXX)}
mkdir -p "$OUT"
declare -A BIN
for spec in ${FLOWGATES:-}; do BIN[flowgate-${spec%%=*}]=${spec#*=}; done

die() { echo "run.sh: $*" >&2; exit 1; }
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 && $DURATION -le 600 ]] || die "DURATION: whole seconds, 1..600"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 50 ]] || die "ROUNDS: 1..50"
command -v taskset >/dev/null || die "taskset is missing (util-linux)"
[[ -x /usr/bin/time ]] || die "/usr/bin/time is missing (apt-get install time)"
[[ -x $FLOWGATE ]] || die "no flowgate binary at $FLOWGATE (cargo build --release -p flowgate-server)"
[[ -x $LOADGEN ]] || die "no load generator at $LOADGEN"
for s in $SERVERS; do
  case $s in
    flowgate | noop) ;;
    flowgate-*) [[ -x ${BIN[$s]:-} ]] || die "$s: no binary (FLOWGATES=\"${s#flowgate-}=/path/to/flowgate\")" ;;
    limitador | limitador-h) [[ -n ${LIMITADOR:-} && -x $LIMITADOR ]] || die "set LIMITADOR=/path/to/limitador-server" ;;
    *) die "unknown server $s" ;;
  esac
done
for s in $SCENARIOS; do
  case $s in
    allowed | half | paced) ;;
    h2load) command -v "$H2LOAD" >/dev/null || die "h2load is missing (apt-get install nghttp2-client)" ;;
    *) die "unknown scenario $s" ;;
  esac
done
command -v curl >/dev/null || die "curl is missing"
command -v python3 >/dev/null || die "python3 is missing"
TCK=$(getconf CLK_TCK)

# --- configurations: the same limit for both -------------------------------------------------
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

# The h2load body: one gRPC message (uncompressed flag, big-endian length, then the protobuf
# RateLimitRequest {domain: "bench", descriptors: [{entries: [{key: "api_key", value: "k0"}]}],
# hits_addend: 1}), encoded by hand.
python3 - "$OUT/request.bin" <<'PY'
import sys
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)
def field(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload
entry = field(1, b"api_key") + field(2, b"k0")
request = field(1, b"bench") + field(2, field(1, entry)) + varint(3 << 3) + varint(1)
open(sys.argv[1], "wb").write(b"\0" + len(request).to_bytes(4, "big") + request)
PY

# --- servers ---------------------------------------------------------------------------------
declare -A PID GRPC HTTP
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() { # port pid name
  for _ in $(seq 200); do
    kill -0 "$2" 2>/dev/null || die "$3 exited at start; see $OUT/$3.log"
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  die "$3 does not listen on 127.0.0.1:$1 after 10 s; see $OUT/$3.log"
}

i=0
for s in $SERVERS; do
  http=$((PORT_BASE + 10 * i)) grpc=$((PORT_BASE + 10 * i + 1))
  i=$((i + 1))
  case $s in
    flowgate) cmd=("$FLOWGATE" serve --config "$OUT/flowgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc") ;;
    flowgate-*) cmd=("${BIN[$s]}" serve --config "$OUT/flowgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc") ;;
    noop) cmd=("$FLOWGATE" serve --noop --config "$OUT/flowgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc") ;;
    limitador) cmd=("$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 --http-port "$http" "$OUT/limitador.yaml" memory) ;;
    limitador-h) cmd=("$LIMITADOR" -H DRAFT_VERSION_03 --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 --http-port "$http" "$OUT/limitador.yaml" memory) ;;
  esac
  echo "${cmd[*]}" >"$OUT/$s.cmd"
  # The environment variables limitador also reads would override nothing given on the
  # command line, but keep them out all the same.
  env -u LIMITS_FILE -u REDIS_URL -u DISK_PATH -u RATE_LIMIT_HEADERS -u TRACING_ENDPOINT \
    taskset -c "$SERVER_CPU" "${cmd[@]}" >"$OUT/$s.log" 2>&1 &
  PID[$s]=$!
  pids+=("$!")
  GRPC[$s]=$grpc HTTP[$s]=$http
done
for s in $SERVERS; do
  wait_port "${GRPC[$s]}" "${PID[$s]}" "$s"
  wait_port "${HTTP[$s]}" "${PID[$s]}" "$s"
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
threads() { ls "/proc/$1/task" | wc -l; }

# What one request of the h2load body gets back (decoded from curl's copy of the gRPC reply).
describe() { # server
  curl -s --http2-prior-knowledge --max-time 5 -H 'content-type: application/grpc' -H 'te: trailers' \
    --data-binary @"$OUT/request.bin" -o "$OUT/$1.reply.bin" \
    "http://127.0.0.1:${GRPC[$1]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || true
  python3 - "$OUT/$1.reply.bin" <<'PY'
import sys
data = open(sys.argv[1], "rb").read()
if len(data) < 5:
    print("no gRPC message in the reply"); sys.exit()
msg = data[5:5 + int.from_bytes(data[1:5], "big")]
def fields(buf):
    i = 0
    while i < len(buf):
        tag = 0; shift = 0
        while True:
            b = buf[i]; i += 1; tag |= (b & 0x7F) << shift; shift += 7
            if b < 0x80: break
        num, wt = tag >> 3, tag & 7
        if wt == 0:
            v = 0; shift = 0
            while True:
                b = buf[i]; i += 1; v |= (b & 0x7F) << shift; shift += 7
                if b < 0x80: break
            yield num, v
        elif wt == 2:
            n = 0; shift = 0
            while True:
                b = buf[i]; i += 1; n |= (b & 0x7F) << shift; shift += 7
                if b < 0x80: break
            yield num, buf[i:i + n]; i += n
        else:
            raise SystemExit(f"unexpected wire type {wt}")
code, statuses, headers = None, 0, []
for num, v in fields(msg):
    if num == 1: code = v
    elif num == 2: statuses += 1
    elif num == 3:
        kv = dict(fields(v)); headers.append(f"{kv.get(1, b'').decode()}: {kv.get(2, b'').decode()}")
print(f"overall_code {code}, {statuses} descriptor statuses, {len(msg)} bytes, headers: {'; '.join(headers) or '(none)'}")
PY
}

# A count the server keeps of decisions (for the h2load check).
counted() { # server
  local m
  m=$(curl -s --max-time 5 "http://127.0.0.1:${HTTP[$1]}/metrics" || true)
  case $1 in
    flowgate*) awk '/^flowgate_hits_total\{.*domain="bench"/ {s += $2} END {print s + 0}' <<<"$m" ;;
    limitador*) awk '/^authorized_calls\{.*limitador_namespace="bench"/ {s += $2} END {print s + 0}' <<<"$m" ;;
    *) echo "n/a" ;;
  esac
}

# The load generator's command line, less the target and the run's length.
read -ra extra <<<"$EXTRA_LOADGEN"
lg=(taskset -c "$LOAD_CPU" "$LOADGEN" loadgen --domain bench --key api_key --keys "$KEYS"
  --concurrency "$CONCURRENCY" --json "${extra[@]}")

# Warm-up: every value gets counted once (20 draws per value: the chance that one of 1,000 is
# missed is ~2e-6), so that a heavy request of `half` is denied, not granted on a fresh counter.
for s in $SERVERS; do
  "${lg[@]}" --target "grpc://127.0.0.1:${GRPC[$s]}" --requests $((KEYS * 20)) >"$OUT/$s.warmup.json" ||
    die "warm-up of $s failed; see $OUT/$s.log"
  echo "$s: warm-up $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["requests"], "answered,", r["errors"], "errors")' "$OUT/$s.warmup.json")," \
    "$(threads "${PID[$s]}") threads; reply: $(describe "$s")" | tee -a "$OUT/servers.txt"
  if [[ " $SCENARIOS " == *" h2load "* && $s != noop ]]; then
    before=$(counted "$s")
    taskset -c "$LOAD_CPU" "$H2LOAD" -n 100 -c 1 -d "$OUT/request.bin" -H 'content-type: application/grpc' \
      -H 'te: trailers' "http://127.0.0.1:${GRPC[$s]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >/dev/null
    after=$(counted "$s")
    echo "$s: 100 h2load requests counted as $(python3 -c "print($after - $before)") decisions by the server's metrics" | tee -a "$OUT/servers.txt"
  fi
done

# Servers not being measured are stopped (SIGSTOP): idle ones still wake up (Flowgate's clock
# thread ticks every millisecond) and would take time from the measured one on the same core.
for s in $SERVERS; do kill -STOP "${PID[$s]}"; done

# --- rounds ----------------------------------------------------------------------------------
# One TSV line per run.
echo -e "round\tscenario\tserver\tanswered\telapsed_s\tok\tdenied\terrors\tp50_us\tp99_us\tserver_ticks\tgen_user_s\tgen_sys_s\tgen_wall_s\tload_before\tload_after" >"$OUT/runs.tsv"
read -ra server_list <<<"$SERVERS"
n=${#server_list[@]}
for round in $(seq "$ROUNDS"); do
  for scenario in $SCENARIOS; do
    for k in $(seq 0 $((n - 1))); do
      s=${server_list[$(((k + round - 1) % n))]}
      base="$OUT/$round.$scenario.$s"
      kill -CONT "${PID[$s]}"
      sleep 0.2
      load_before=$(cut -d' ' -f1-3 /proc/loadavg)
      t0=$(ticks "${PID[$s]}")
      case $scenario in
        allowed | half | paced)
          flags=(--duration "${DURATION}s" --seed "$round")
          [[ $scenario == half ]] && flags+=(--heavy-share 0.5 --heavy-hits "$LIMIT")
          [[ $scenario == paced ]] && flags+=(--rate "$RATE")
          /usr/bin/time -f '%U %S %e' -o "$base.time" \
            "${lg[@]}" --target "grpc://127.0.0.1:${GRPC[$s]}" "${flags[@]}" >"$base.json"
          ;;
        h2load)
          /usr/bin/time -f '%U %S %e' -o "$base.time" \
            taskset -c "$LOAD_CPU" "$H2LOAD" -c 8 -m 16 -t 1 -D "$DURATION" -d "$OUT/request.bin" \
            -H 'content-type: application/grpc' -H 'te: trailers' --log-file="$base.log" \
            "http://127.0.0.1:${GRPC[$s]}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" >"$base.out"
          ;;
      esac
      t1=$(ticks "${PID[$s]}")
      kill -STOP "${PID[$s]}"
      load_after=$(cut -d' ' -f1-3 /proc/loadavg)
      python3 - "$scenario" "$base" "$round" "$s" "$((t1 - t0))" "$load_before" "$load_after" >>"$OUT/runs.tsv" <<'PY'
import json, re, sys
scenario, base, rnd, server, ticks, lb, la = sys.argv[1:]
user, sys_, wall = open(base + ".time").read().split()[-3:]
if scenario == "h2load":
    out = open(base + ".out").read()
    m = re.search(r"finished in ([\d.]+)(m?s)", out)
    elapsed = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    m = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    done, ok, failed, errored = int(m.group(3)), int(m.group(4)), int(m.group(5)), int(m.group(6))
    lat = sorted(int(line.split("\t")[2]) for line in open(base + ".log") if line.strip())
    # Every request the server answered during the run is in the log (h2load's own count
    # covers the measurement window only).
    answered = len(lat)
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0
    row = [answered, elapsed, ok, 0, failed + errored, p(0.50), p(0.99)]
else:
    r = json.load(open(base + ".json"))
    row = [r["requests"], r["elapsed_s"], r["ok"], r["over_limit"], r["errors"],
           r["latency_us"]["p50"], r["latency_us"]["p99"]]
print("\t".join(str(x) for x in [rnd, scenario, server] + row + [ticks, user, sys_, wall, lb, la]))
PY
      tail -1 "$OUT/runs.tsv" | awk -F'\t' -v tck="$TCK" '{printf "round %s %-8s %-12s %8.0f/s  server %5.2f us/decision  p99 %6.0f us  errors %s  load %s -> %s\n", $1, $2, $3, $4 / $5, $11 / tck * 1e6 / ($4 > 0 ? $4 : 1), $10, $8, $15, $16}'
    done
  done
done

# --- summary ---------------------------------------------------------------------------------
python3 - "$OUT/runs.tsv" "$TCK" "$SCENARIOS" "$SERVERS" <<'PY' | tee "$OUT/summary.txt"
import csv, statistics, sys
path, tck, scenarios, servers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
rows = list(csv.DictReader(open(path), delimiter="\t"))
med = statistics.median
def stats(scenario, server):
    rs = [r for r in rows if r["scenario"] == scenario and r["server"] == server]
    if not rs:
        return None
    f = lambda k: [float(r[k]) for r in rs]
    answered = f("answered")
    us = [float(r["server_ticks"]) / tck * 1e6 / max(a, 1) for r, a in zip(rs, answered)]
    gen = [(float(r["gen_user_s"]) + float(r["gen_sys_s"])) * 1e6 / max(a, 1) for r, a in zip(rs, answered)]
    busy = [(float(r["gen_user_s"]) + float(r["gen_sys_s"])) / float(r["gen_wall_s"]) * 100 for r in rs]
    srv_busy = [float(r["server_ticks"]) / tck / float(r["elapsed_s"]) * 100 for r in rs]
    return dict(
        rate=med(a / e for a, e in zip(answered, f("elapsed_s"))),
        us=med(us), us_all=us, p50=med(f("p50_us")), p99=med(f("p99_us")),
        denied=med(d / max(a, 1) * 100 for d, a in zip(f("denied"), answered)),
        errors=sum(f("errors")), gen=med(gen), busy=med(busy), srv_busy=med(srv_busy),
        loads=[r["load_before"].split()[0] for r in rs] + [r["load_after"].split()[0] for r in rs],
        n=len(rs))
print(f"{'scenario':<9}{'server':<13}{'decisions/s':>12}{'srv us/dec':>11}{'srv busy':>9}{'p50 us':>8}{'p99 us':>8}"
      f"{'denied':>8}{'errors':>7}{'gen us/req':>11}{'gen busy':>9}   server us/decision per round")
table = {}
for sc in scenarios:
    for sv in servers:
        st = stats(sc, sv)
        if st is None:
            continue
        table[sc, sv] = st
        print(f"{sc:<9}{sv:<13}{st['rate']:>12,.0f}{st['us']:>11.2f}{st['srv_busy']:>8.0f}%{st['p50']:>8.0f}{st['p99']:>8.0f}"
              f"{st['denied']:>7.1f}%{st['errors']:>7.0f}{st['gen']:>11.2f}{st['busy']:>8.0f}%   "
              + " · ".join(f"{u:.2f}" for u in st["us_all"]))
print()
print("Flowgate's decisions per server CPU-second ÷ the peer's (= peer us/decision ÷ Flowgate's; target ≥ 1.5),")
print("p99 ratio (Flowgate ÷ peer; target ≤ 1), and the load generator's headroom (server us/decision ÷ generator")
print("us/request: how many server cores one generator core could drive; target ≥ 2):")
for sc in scenarios:
    for ours in [sv for sv in servers if sv.startswith("flowgate")]:
        fg = table.get((sc, ours))
        for peer in ("limitador", "limitador-h", "noop"):
            pe = table.get((sc, peer))
            if fg and pe:
                print(f"  {sc:<8} {ours} vs {peer:<12} CPU {pe['us'] / fg['us']:.2f}x   decisions/s {fg['rate'] / pe['rate']:.2f}x   p99 {fg['p99'] / max(pe['p99'], 1):.2f}x")
    for sv in servers:
        st = table.get((sc, sv))
        if st:
            print(f"  {sc:<8} generator headroom against {sv:<12} {st['us'] / st['gen']:.2f}x")
    # The generator's cost per request is lowest when it is busiest (its reads and writes carry
    # more requests each): against the no-op server, the fastest target, it shows what one
    # generator core can drive; compared with Flowgate's server cost in the same scenario.
    fg, noop = table.get((sc, "flowgate")), table.get((sc, "noop"))
    if fg and noop:
        print(f"  {sc:<8} generator headroom, Flowgate's server us/decision ÷ the generator's us/request against noop "
              f"({noop['gen']:.2f} us at {noop['rate']:,.0f}/s): {fg['us'] / noop['gen']:.2f}x")
loads = [float(x) for st in table.values() for x in st["loads"]]
print(f"\n/proc/loadavg (1 min) over the runs: {min(loads):.2f}–{max(loads):.2f}; raw runs in {path}")
PY
