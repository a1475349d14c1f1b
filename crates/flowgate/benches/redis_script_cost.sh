#!/usr/bin/env bash
# Redis-side cost per decision, without the Rust client in the picture: redis-benchmark (a C
# client) drives (a) the redis_rate-style GCRA script, one key per EVALSHA, and (b) Flowgate's
# gcra script with batches of 20 random keys per EVALSHA, in alternating rounds against one
# redis-server started here on a free port. Reports Redis's execution time per decision from
# INFO commandstats (usec per call / decisions per call).
#
#   bash crates/flowgate/benches/redis_script_cost.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/../src/store/redis"
rounds=${1:-3}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/pid" --logfile "$dir/log"
trap 'kill -9 $(cat "$dir/pid") 2>/dev/null; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done

rr=$(sed -n '/^const REDIS_RATE/,/^"#;/p' ../../../benches/redis_store.rs | sed '1d;$d')
rr_sha=$(redis-cli -p "$port" script load "$rr")
fg_sha=$(redis-cli -p "$port" script load "$(cat prelude.lua; echo; cat gcra.lua)")
keys=(); for _ in $(seq 1 20); do keys+=("k:__rand_int__"); done

cost() { # name, decisions per call, requests, command...
  local name=$1 per=$2 n=$3; shift 3
  redis-cli -p "$port" config resetstat >/dev/null
  redis-benchmark -p "$port" -c 4 -n "$n" -r 10000 "$@" >/dev/null 2>&1
  redis-cli -p "$port" info commandstats | grep '^cmdstat_evalsha' |
    sed 's/.*usec_per_call=\([0-9.]*\).*/\1/' |
    awk -v name="$name" -v per="$per" '{printf "%-46s %7.2f µs per decision (%s per call)\n", name, $1 / per, $1}'
}
echo "redis-server $(redis-server --version | cut -d' ' -f3), port $port"
for r in $(seq 1 "$rounds"); do
  echo "round $r"
  # 1000 per second: T = 1 ms, τ = 1 s, expiry buckets of 2^20 µs. ARGV: now from TIME,
  # check (not refund), 1 quota, uniform cost 1, the quota block.
  cost "(a) redis_rate-style GCRA, 1 key per EVALSHA" 1 20000 \
    EVALSHA "$rr_sha" 1 rr:__rand_int__ 1000 1000 1 1
  cost "(b) flowgate gcra, 20 keys per EVALSHA" 20 2000 \
    EVALSHA "$fg_sha" 20 "${keys[@]}" "" "" 0 1 1 1000 0 1000000 0 1048576
done
