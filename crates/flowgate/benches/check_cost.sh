#!/bin/bash
# Instructions, D1 misses and last-level data misses per check, from cachegrind (see
# check_cost.rs): runs BINARY with R=10 and R=20 rounds over N keys and divides the difference
# by 10 × N. Usage: check_cost.sh BINARY keyed|store [N]
set -euo pipefail
bin=$1 mode=$2 n=${3:-1000000}
run() {
    MODE=$mode N=$n R=$1 valgrind --tool=cachegrind --cache-sim=yes \
        --cachegrind-out-file=/dev/null "$bin" 2>&1 |
        sed 's/,//g' |
        awk '/I *refs/ {i=$4} /D1  misses/ {d=$4} /LLd misses/ {l=$4} END {print i, d, l}'
}
read -r i1 d1 l1 < <(run 10)
read -r i2 d2 l2 < <(run 20)
awk -v m="$mode" -v n="$n" -v i="$((i2 - i1))" -v d="$((d2 - d1))" -v l="$((l2 - l1))" 'BEGIN {
    printf "%s per check: %.1f instructions, %.3f D1 misses, %.3f LL data misses\n", m, i / (10 * n), d / (10 * n), l / (10 * n)
}'
