#!/usr/bin/env bash
# Unary requests and plain bodies before and after a change (issue 42: the streams merge):
# instructions per request through the middleware benchmark's routers
# (benches/src/bin/middleware_requests.rs), counted by valgrind's cachegrind for this tree
# and for BASE (default e64a35d, main just before the merge of `streams`), with
# tower_governor counted by each build as the control: its count must not move, and
# tollgate's is compared with it and with the other build's.
#
#   bash scripts/unary_compare.sh [BASE]
#
# Each config runs twice per build, with 20,000 and 60,000 requests; per request is the
# difference over the 40,000 between (start-up not counted), as scripts/middleware_count.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

base=${1:-e64a35d}
source scripts/valgrind.sh

target="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build -q -p tollgate-bench --release --bin middleware_requests
cp "$target/release/middleware_requests" "$target/middleware_requests.head"
tree="$target/unary-base"
rm -rf "$tree" && mkdir -p "$tree"
git archive "$base" | tar -x -C "$tree"
(cd "$tree" && CARGO_TARGET_DIR="$target" cargo build -q -p tollgate-bench --release --bin middleware_requests)
cp "$target/release/middleware_requests" "$target/middleware_requests.base"

configs=(bare tollgate tower_governor tollgate_denied tower_governor_denied)
declare -A per
for build in base head; do
  bin="$target/middleware_requests.$build"
  for config in "${configs[@]}"; do
    low=$(instructions "$config" 20000)
    high=$(instructions "$config" 60000)
    per[$build.$config]=$(( (high - low) / 40000 ))
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
printf '%-22s %10s %10s %12s %14s %14s\n' config "base" "head" "head÷base" "base÷governor" "head÷governor"
for config in "${configs[@]}"; do
  case "$config" in
    tollgate_denied|tower_governor_denied) anchor=tower_governor_denied ;;
    *) anchor=tower_governor ;;
  esac
  b=${per[base.$config]} h=${per[head.$config]}
  printf '%-22s %10s %10s %12s %14s %14s\n' "$config" "$b" "$h" "$(ratio "$h" "$b")" \
    "$(ratio "$b" "${per[base.$anchor]}")" "$(ratio "$h" "${per[head.$anchor]}")"
done
