#!/usr/bin/env bash
# Instructions per request through the middleware benchmark's routers, counted by
# valgrind's cachegrind: a figure that does not move with the machine's load, for
# comparing builds and configs on a noisy machine (time is what users feel; compare it with
# `cargo bench -p tollgate-bench --bench middleware`).
#
#   bash scripts/middleware_count.sh
#
# Each config (benches/src/bin/middleware_requests.rs) runs twice under cachegrind, with
# 20,000 and 60,000 requests; instructions per request are the difference over the 40,000
# requests in between, so start-up (the runtime, the router, the clock's calibration) is
# not counted. Instructions are not time: a cache miss or a division costs more than an
# add. Installs valgrind (Debian package) if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/middleware_requests.sh

declare -A per
configs=(bare noop_layer tollgate tollgate_no_extensions tollgate_routes tower_governor tollgate_denied tollgate_denied_constant tower_governor_denied)
for config in "${configs[@]}"; do
  low=$(instructions "$config" 20000)
  high=$(instructions "$config" 60000)
  per[$config]=$(( (high - low) / 40000 ))
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
printf '%-24s %12s %10s %12s %16s\n' config instr/request "÷ bare" "÷ no-op" "÷ tower_governor"
for config in "${configs[@]}"; do
  anchor=""
  case "$config" in
    tollgate|tollgate_no_extensions|tollgate_routes) anchor=$(ratio "${per[$config]}" "${per[tower_governor]}") ;;
    tollgate_denied|tollgate_denied_constant) anchor=$(ratio "${per[$config]}" "${per[tower_governor_denied]}") ;;
  esac
  printf '%-24s %12s %10s %12s %16s\n' "$config" "${per[$config]}" \
    "$(ratio "${per[$config]}" "${per[bare]}")" "$(ratio "${per[$config]}" "${per[noop_layer]}")" "$anchor"
done
