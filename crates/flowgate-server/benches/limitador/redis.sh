#!/usr/bin/env bash
# Flowgate's gRPC service against Kuadrant's limitador-server with counters in Redis, side by
# side on one machine (BENCHMARKS.md, "Service against limitador-server", "With counters in
# Redis"). Same limit for both: domain `bench`, descriptor `api_key`, one counter per value,
# fixed window of a year (limitador has only fixed windows; Flowgate is told
# `algorithm: fixed_window`).
#
#   LIMITADOR=/path/to/limitador-server crates/flowgate-server/benches/limitador/redis.sh
#
# The peer is not built here: bring your own binary of it (its own release profile).
#
# One private `redis-server` (started here on a free loopback port, `--save "" --appendonly
# no`, never another one) runs pinned to the load generator's core (`taskset -c $LOAD_CPU`),
# the server being measured to the other (`taskset -c $SERVER_CPU`). Every run starts from an
# empty Redis: `FLUSHALL` and `CONFIG RESETSTAT`, then the server is started (so that no
# server keeps a cache of counters Redis no longer has), the run, and the server is stopped.
# Every round runs every scenario against every server, the servers' order rotating from
# round to round. Per run: decisions/s, the server's CPU per decision (/proc/PID/stat, utime +
# stime, all threads), Redis's CPU per decision (`INFO cpu`, used_cpu_user + used_cpu_sys,
# delta over the run — the server's start and its first script loads included), Redis
# commands and `EVALSHA`/`EVAL` calls per decision (`INFO commandstats`), admitted and denied
# counts, and Flowgate's fallback decisions (`flowgate_fallback_decisions_total`: requests its
# rule's `fail` mode answered because Redis did not answer within --redis-timeout, 50 ms by
# default — fail open admits them uncounted). The summary gives medians over rounds.
#
# Scenarios (SCENARIOS):
#   keys1000  `flowgate loadgen`, 64 callers, 1,000 values of `api_key` drawn uniformly,
#             hits_addend 1, limit 10^9 per year: nothing is denied.
#   key1      the same with one value.
#   deny      exactness: one value, limit DENY_LIMIT (200,000) per year, DENY_REQUESTS
#             (400,000) requests of hits_addend 1 as fast as they go: a server that admits more
#             than DENY_LIMIT over-admits.
#
# Servers (SERVERS):
#   flowgate          `flowgate serve --redis redis://127.0.0.1:PORT`
#   limitador-redis   `limitador-server … redis redis://127.0.0.1:PORT`
#   limitador-cached  `limitador-server … redis_cached redis://127.0.0.1:PORT` (its defaults:
#                     counters cached in the process, flushed to Redis every second — not
#                     exact by design)
#   flowgate-TAG      `flowgate serve --redis …` from another binary, named in FLOWGATES="TAG=/path …"
#                     (e.g. a build before a change, measured in the same run)
#
# Environment: LIMITADOR (required when a limitador server is selected), FLOWGATE (default
# target/release/flowgate; also the load generator unless LOADGEN is set), DURATION (seconds
# per run, 10), ROUNDS (5), SERVERS ("flowgate limitador-redis limitador-cached"), SCENARIOS
# ("keys1000 key1 deny"), CONCURRENCY (64), DENY_LIMIT (200000), DENY_REQUESTS (400000),
# SERVER_CPU (0), LOAD_CPU (1), PORT_BASE (19200), OUT (directory for raw results; default a
# new temporary one, kept), FLOWGATES (more Flowgate binaries, "TAG=/path …"; add flowgate-TAG to
# SERVERS).
set -euo pipefail

FLOWGATE=${FLOWGATE:-target/release/flowgate}
LOADGEN=${LOADGEN:-$FLOWGATE}
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-5}
SERVERS=${SERVERS:-"flowgate limitador-redis limitador-cached"}
SCENARIOS=${SCENARIOS:-"keys1000 key1 deny"}
CONCURRENCY=${CONCURRENCY:-64}
DENY_LIMIT=${DENY_LIMIT:-200000}
DENY_REQUESTS=${DENY_REQUESTS:-400000}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PORT_BASE=${PORT_BASE:-19200}
LIMIT=1000000000
OUT=${OUT:-$(mktemp -d /tmp/flowgate-vs-limitador-redis.XXXXXX)}
mkdir -p "$OUT"
declare -A BIN
BIN[flowgate]=$FLOWGATE
for spec in ${FLOWGATES:-}; do BIN[flowgate-${spec%%=*}]=${spec#*=}; done

die() { echo "redis.sh: $*" >&2; exit 1; }
[[ $DURATION =~ ^[0-9]+$ && $DURATION -ge 1 && $DURATION -le 600 ]] || die "DURATION: whole seconds, 1..600"
[[ $ROUNDS =~ ^[0-9]+$ && $ROUNDS -ge 1 && $ROUNDS -le 50 ]] || die "ROUNDS: 1..50"
for tool in taskset redis-server redis-cli python3 curl; do
  command -v "$tool" >/dev/null || die "$tool is missing"
done
[[ -x $FLOWGATE ]] || die "no flowgate binary at $FLOWGATE (cargo build --release -p flowgate-server)"
[[ -x $LOADGEN ]] || die "no load generator at $LOADGEN"
for s in $SERVERS; do
  case $s in
    flowgate) ;;
    flowgate-*) [[ -x ${BIN[$s]:-} ]] || die "$s: no binary (FLOWGATES=\"${s#flowgate-}=/path/to/flowgate\")" ;;
    limitador-redis | limitador-cached) [[ -n ${LIMITADOR:-} && -x $LIMITADOR ]] || die "set LIMITADOR=/path/to/limitador-server" ;;
    *) die "unknown server $s" ;;
  esac
done
for s in $SCENARIOS; do
  case $s in keys1000 | key1 | deny) ;; *) die "unknown scenario $s" ;; esac
done
TCK=$(getconf CLK_TCK)

# --- configurations: the same limits for both ------------------------------------------------
for limit in $LIMIT $DENY_LIMIT; do
  cat >"$OUT/flowgate.$limit.yaml" <<YAML
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: year, requests_per_unit: $limit, algorithm: fixed_window}
YAML
  cat >"$OUT/limitador.$limit.yaml" <<YAML
---
- namespace: bench
  max_value: $limit
  seconds: 31536000
  conditions: []
  variables:
    - descriptors[0].api_key
YAML
done

# --- the private Redis -------------------------------------------------------------------------
REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$OUT/redis"
taskset -c "$LOAD_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$OUT/redis" --logfile "$OUT/redis/log" >/dev/null 2>&1 &
REDIS_PID=$!
server_pid=
cleanup() {
  [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  kill "$REDIS_PID" 2>/dev/null || true
  wait "$REDIS_PID" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rcli() { redis-cli -p "$REDIS_PORT" "$@"; }
for _ in $(seq 100); do rcli ping >/dev/null 2>&1 && break; sleep 0.05; done
rcli ping >/dev/null || die "redis-server did not start; see $OUT/redis/log"
REDIS_URL=redis://127.0.0.1:$REDIS_PORT
echo "redis-server $(redis-server --version | cut -d' ' -f3) on port $REDIS_PORT (pid $REDIS_PID, core $LOAD_CPU)" | tee "$OUT/servers.txt"

redis_cpu() { rcli info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}'; }
# "calls of EVALSHA+EVAL, calls of every command"
redis_calls() {
  rcli info commandstats | tr -d '\r' | awk -F'[:=,]' '/^cmdstat_/ {all += $3; if ($1 == "cmdstat_evalsha" || $1 == "cmdstat_eval") ev += $3} END {print ev + 0, all + 0}'
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

wait_port() { # port pid name
  for _ in $(seq 200); do
    kill -0 "$2" 2>/dev/null || die "$3 exited at start; see $OUT/$3.log"
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  die "$3 does not listen on 127.0.0.1:$1 after 10 s; see $OUT/$3.log"
}

start_server() { # server limit -> sets server_pid, GRPC
  local s=$1 limit=$2 http=$PORT_BASE
  GRPC=$((PORT_BASE + 1))
  case $s in
    flowgate*) cmd=("${BIN[$s]}" serve --config "$OUT/flowgate.$limit.yaml" --redis "$REDIS_URL" --http "127.0.0.1:$http" --grpc "127.0.0.1:$GRPC") ;;
    limitador-redis) cmd=("$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$GRPC" --http-ip 127.0.0.1 --http-port "$http" "$OUT/limitador.$limit.yaml" redis "$REDIS_URL") ;;
    limitador-cached) cmd=("$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$GRPC" --http-ip 127.0.0.1 --http-port "$http" "$OUT/limitador.$limit.yaml" redis_cached "$REDIS_URL") ;;
  esac
  echo "${cmd[*]}" >"$OUT/$s.cmd"
  env -u LIMITS_FILE -u REDIS_URL -u DISK_PATH -u RATE_LIMIT_HEADERS -u TRACING_ENDPOINT \
    taskset -c "$SERVER_CPU" "${cmd[@]}" >>"$OUT/$s.log" 2>&1 &
  server_pid=$!
  wait_port "$GRPC" "$server_pid" "$s"
  wait_port "$http" "$server_pid" "$s"
}
stop_server() {
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}

lg=(taskset -c "$LOAD_CPU" "$LOADGEN" loadgen --domain bench --key api_key --concurrency "$CONCURRENCY" --json)

# --- rounds ------------------------------------------------------------------------------------
echo -e "round\tscenario\tserver\tanswered\telapsed_s\tok\tdenied\terrors\tp50_us\tp99_us\tserver_ticks\tredis_cpu_s\tevals\tcommands\tfallbacks\tload_before\tload_after" >"$OUT/runs.tsv"
read -ra server_list <<<"$SERVERS"
n=${#server_list[@]}
for round in $(seq "$ROUNDS"); do
  for scenario in $SCENARIOS; do
    for k in $(seq 0 $((n - 1))); do
      s=${server_list[$(((k + round - 1) % n))]}
      base="$OUT/$round.$scenario.$s"
      limit=$LIMIT
      [[ $scenario == deny ]] && limit=$DENY_LIMIT
      rcli flushall >/dev/null
      rcli config resetstat >/dev/null
      start_server "$s" "$limit"
      sleep 0.2
      load_before=$(cut -d' ' -f1-3 /proc/loadavg)
      c0=$(redis_cpu)
      t0=$(ticks "$server_pid")
      case $scenario in
        keys1000) flags=(--keys 1000 --duration "${DURATION}s" --seed "$round") ;;
        key1) flags=(--keys 1 --duration "${DURATION}s" --seed "$round") ;;
        deny) flags=(--keys 1 --requests "$DENY_REQUESTS" --seed "$round") ;;
      esac
      "${lg[@]}" --target "grpc://127.0.0.1:$GRPC" "${flags[@]}" >"$base.json"
      t1=$(ticks "$server_pid")
      fallbacks=0
      if [[ $s == flowgate* ]]; then
        fallbacks=$(curl -s --max-time 5 "http://127.0.0.1:$PORT_BASE/metrics" |
          awk '/^flowgate_fallback_decisions_total/ {s += $2} END {print s + 0}')
      fi
      # limitador's cached storage writes to Redis in the background: let it flush (its
      # default period is 1 s) before reading what Redis did for it.
      [[ $s == limitador-cached ]] && sleep 2
      c1=$(redis_cpu)
      read -r evals commands <<<"$(redis_calls)"
      load_after=$(cut -d' ' -f1-3 /proc/loadavg)
      stop_server
      python3 - "$base" "$round" "$scenario" "$s" "$((t1 - t0))" "$c0" "$c1" "$evals" "$commands" "$fallbacks" "$load_before" "$load_after" >>"$OUT/runs.tsv" <<'PY'
import json, sys
base, rnd, scenario, server, ticks, c0, c1, evals, commands, fallbacks, lb, la = sys.argv[1:]
r = json.load(open(base + ".json"))
row = [rnd, scenario, server, r["requests"], r["elapsed_s"], r["ok"], r["over_limit"], r["errors"],
       r["latency_us"]["p50"], r["latency_us"]["p99"], ticks, f"{float(c1) - float(c0):.6f}", evals, commands, fallbacks, lb, la]
print("\t".join(str(x) for x in row))
PY
      tail -1 "$OUT/runs.tsv" | awk -F'\t' -v tck="$TCK" '{a = ($4 > 0 ? $4 : 1); printf "round %s %-8s %-16s %8.0f/s  server %5.2f us/dec  redis %5.2f us/dec  %.3f evals/dec  %.2f cmds/dec  ok %s denied %s errors %s fallbacks %s  load %s -> %s\n", $1, $2, $3, $4 / $5, $11 / tck * 1e6 / a, $12 * 1e6 / a, $13 / a, $14 / a, $6, $7, $8, $15, $16, $17}'
    done
  done
done

# --- summary -----------------------------------------------------------------------------------
python3 - "$OUT/runs.tsv" "$TCK" "$SCENARIOS" "$SERVERS" "$DENY_LIMIT" <<'PY' | tee "$OUT/summary.txt"
import csv, statistics, sys
path, tck, scenarios, servers, deny_limit = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split(), int(sys.argv[5])
rows = list(csv.DictReader(open(path), delimiter="\t"))
med = statistics.median
table = {}
print(f"{'scenario':<9}{'server':<18}{'decisions/s':>12}{'srv us/dec':>11}{'redis us/dec':>13}{'evals/dec':>10}{'cmds/dec':>9}"
      f"{'p99 us':>8}{'errors':>7}{'fallbk':>7}   admitted (ok) per round   redis us/decision per round")
for sc in scenarios:
    for sv in servers:
        rs = [r for r in rows if r["scenario"] == sc and r["server"] == sv]
        if not rs:
            continue
        a = [max(float(r["answered"]), 1) for r in rs]
        st = dict(
            rate=med(float(r["answered"]) / float(r["elapsed_s"]) for r in rs),
            srv=med(float(r["server_ticks"]) / tck * 1e6 / x for r, x in zip(rs, a)),
            redis_all=[float(r["redis_cpu_s"]) * 1e6 / x for r, x in zip(rs, a)],
            evals=med(float(r["evals"]) / x for r, x in zip(rs, a)),
            cmds=med(float(r["commands"]) / x for r, x in zip(rs, a)),
            p99=med(float(r["p99_us"]) for r in rs),
            errors=sum(int(r["errors"]) for r in rs),
            ok=[int(r["ok"]) for r in rs],
            fallbacks=sum(int(r["fallbacks"]) for r in rs),
            loads=[float(r["load_before"].split()[0]) for r in rs] + [float(r["load_after"].split()[0]) for r in rs])
        st["redis"] = med(st["redis_all"])
        table[sc, sv] = st
        print(f"{sc:<9}{sv:<18}{st['rate']:>12,.0f}{st['srv']:>11.2f}{st['redis']:>13.2f}{st['evals']:>10.3f}{st['cmds']:>9.2f}"
              f"{st['p99']:>8.0f}{st['errors']:>7}{st['fallbacks']:>7}   {' · '.join(map(str, st['ok']))}   {' · '.join(f'{u:.2f}' for u in st['redis_all'])}")
print()
print("Flowgate ÷ peer (medians of rounds): decisions/s, server CPU per decision, Redis CPU per decision:")
for sc in scenarios:
    for ours in [sv for sv in servers if sv.startswith("flowgate")]:
      fg = table.get((sc, ours))
      for peer in [sv for sv in servers if sv != ours]:
        pe = table.get((sc, peer))
        if fg and pe:
            print(f"  {sc:<8} {ours} vs {peer:<16} decisions/s {fg['rate'] / pe['rate']:.2f}x   server CPU {fg['srv'] / pe['srv']:.2f}x   Redis CPU {fg['redis'] / pe['redis']:.2f}x")
if "deny" in scenarios:
    print(f"\ndeny: limit {deny_limit}; admitted per round above (exact = {deny_limit})")
loads = [x for st in table.values() for x in st["loads"]]
print(f"\n/proc/loadavg (1 min) over the runs: {min(loads):.2f}–{max(loads):.2f}; raw runs in {path}")
PY
