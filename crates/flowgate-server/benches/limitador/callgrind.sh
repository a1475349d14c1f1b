#!/usr/bin/env bash
# Instructions per decision, noise-free: each server of SERVERS runs under
# `valgrind --tool=callgrind` (all threads counted together), is warmed up, has its counters
# zeroed, answers REQUESTS requests of one scenario, and the instructions it executed meanwhile
# (callgrind's totals) are divided by REQUESTS. Same servers, configurations and scenarios as
# run.sh beside this file (BENCHMARKS.md, "Service against limitador-server").
#
#   LIMITADOR=/path/to/limitador-server crates/flowgate-server/benches/limitador/callgrind.sh
#
# Environment: LIMITADOR (required for limitador servers), FLOWGATE (target/release/flowgate;
# also the load generator), SERVERS ("flowgate limitador limitador-h"), SCENARIOS
# ("allowed half h2load"), REQUESTS (20000), WARMUP (5000), CONCURRENCY (64), KEYS (1000),
# PORT (19300), OUT (directory for the raw callgrind files; default a new temporary one).
set -euo pipefail

FLOWGATE=${FLOWGATE:-target/release/flowgate}
SERVERS=${SERVERS:-"flowgate limitador limitador-h"}
SCENARIOS=${SCENARIOS:-"allowed half h2load"}
REQUESTS=${REQUESTS:-20000}
WARMUP=${WARMUP:-5000}
CONCURRENCY=${CONCURRENCY:-64}
KEYS=${KEYS:-1000}
PORT=${PORT:-19300}
LIMIT=1000000000
OUT=${OUT:-$(mktemp -d /tmp/flowgate-callgrind.XXXXXX)}
mkdir -p "$OUT"

die() { echo "callgrind.sh: $*" >&2; exit 1; }
command -v valgrind >/dev/null || die "valgrind is missing (apt-get install valgrind)"
command -v callgrind_control >/dev/null || die "callgrind_control is missing (valgrind)"
[[ -x $FLOWGATE ]] || die "no flowgate binary at $FLOWGATE"
[[ $REQUESTS =~ ^[0-9]+$ && $REQUESTS -ge 100 ]] || die "REQUESTS: a whole number ≥ 100"

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
# The h2load request: {domain: "bench", descriptors: [{api_key: k0}], hits_addend: 1}.
printf '\0\0\0\0\x1a\n\x05bench\x12\x0f\n\r\n\x07api_key\x12\x02k0\x18\x01' >"$OUT/request.bin"

pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; }
trap cleanup EXIT

http=$PORT grpc=$((PORT + 1))
for s in $SERVERS; do
  case $s in
    flowgate) cmd=("$FLOWGATE" serve --config "$OUT/flowgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc") ;;
    noop) cmd=("$FLOWGATE" serve --noop --config "$OUT/flowgate.yaml" --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc") ;;
    limitador | limitador-h)
      [[ -n ${LIMITADOR:-} && -x $LIMITADOR ]] || die "set LIMITADOR=/path/to/limitador-server"
      headers=()
      [[ $s == limitador-h ]] && headers=(-H DRAFT_VERSION_03)
      cmd=("$LIMITADOR" "${headers[@]}" --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 --http-port "$http" "$OUT/limitador.yaml" memory)
      ;;
    *) die "unknown server $s" ;;
  esac
  for scenario in $SCENARIOS; do
    env -u LIMITS_FILE -u REDIS_URL -u DISK_PATH -u RATE_LIMIT_HEADERS -u TRACING_ENDPOINT \
      taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$OUT/$s.$scenario.%p" "${cmd[@]}" \
      >"$OUT/$s.$scenario.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
      (exec 3<>"/dev/tcp/127.0.0.1/$grpc") 2>/dev/null && break
      kill -0 "$pid" 2>/dev/null || die "$s exited at start; see $OUT/$s.$scenario.log"
      sleep 0.1
    done
    lg=(taskset -c 1 "$FLOWGATE" loadgen --target "grpc://127.0.0.1:$grpc" --domain bench --key api_key
      --keys "$KEYS" --concurrency "$CONCURRENCY" --json)
    "${lg[@]}" --requests "$WARMUP" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    case $scenario in
      allowed) "${lg[@]}" --requests "$REQUESTS" >"$OUT/$s.$scenario.json" ;;
      half) "${lg[@]}" --requests "$REQUESTS" --heavy-share 0.5 --heavy-hits "$LIMIT" >"$OUT/$s.$scenario.json" ;;
      h2load)
        taskset -c 1 h2load -n "$REQUESTS" -c 8 -m 16 -t 1 -d "$OUT/request.bin" -H 'content-type: application/grpc' \
          -H 'te: trailers' "http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
          >"$OUT/$s.$scenario.out"
        ;;
      *) die "unknown scenario $scenario" ;;
    esac
    callgrind_control -d "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=
    # The dump made by -d is the file with the highest part number (the final dump at exit
    # counts only what came after it).
    dump=$(ls "$OUT/$s.$scenario".*.1 2>/dev/null | head -1)
    [[ -n $dump ]] || die "no callgrind dump for $s $scenario in $OUT"
    ir=$(awk '/^(summary|totals):/ {print $2; exit}' "$dump")
    printf '%-12s %-8s %12.0f instructions per request (%s over %s requests)\n' "$s" "$scenario" \
      "$(python3 -c "print($ir / $REQUESTS)")" "$ir" "$REQUESTS" | tee -a "$OUT/summary.txt"
  done
done
echo "raw callgrind files in $OUT"
