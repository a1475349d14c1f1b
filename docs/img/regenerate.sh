#!/usr/bin/env bash
# Regenerates the charts (*.svg) and tables (*.txt) in docs/img/ that docs/choosing.md quotes,
# with `flowgate simulate`: deterministic, so a rerun changes nothing unless the limiters do.
#
#   docs/img/regenerate.sh
#
# crates/flowgate-server/tests/simulate.rs runs every `sim` line below and fails if a committed
# file differs from what the command gives now. Keep each `sim` line on one line, with
# arguments that need no quoting.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cargo build -q --manifest-path "$root/Cargo.toml" -p flowgate-server --bin flowgate
bin="${CARGO_TARGET_DIR:-$root/target}/debug/flowgate"

sim() {
  local name=$1
  shift
  "$bin" simulate --quiet "$@" --svg "$root/docs/img/$name.svg" > "$root/docs/img/$name.txt"
  echo "docs/img/$name.svg, docs/img/$name.txt"
}

sim boundary --scenario boundary
sim bursty --scenario bursty
sim flash-crowd --scenario flash-crowd
sim retry-storm --scenario retry-storm --algorithms gcra,fixed_window,sliding_log
sim retry-storm-honoured --scenario retry-storm-honoured --algorithms gcra,fixed_window,sliding_log
sim deployments --scenario flash-crowd --algorithms gcra --deployments in-process,shared,per-instance,hybrid,fallback-open,fallback-closed,fallback-local --instances 3
sim rlqs --limit 6000 --period 1m --scenario flash-crowd --algorithms gcra,sliding_log --deployments in-process,rlqs --envoys 20 --report-interval 1s
sim rlqs-fleet --limit 6000 --period 1m --scenario flash-crowd --deployments rlqs --envoys 5,20,100 --report-interval 1s,10s
