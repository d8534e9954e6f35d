#!/usr/bin/env bash
# Instructions per check of each algorithm in the memory store, counted by valgrind's
# cachegrind: a figure that does not move with the machine's load, for comparing the
# algorithms (and two builds) where timings move a lot from one run to the next (time is
# what users feel; compare it with `cargo bench -p tollgate-bench --bench memory --
# algorithm`).
#
#   bash scripts/algorithm_count.sh            # this build
#   ALGORITHM_CHECKS=/path/to/algorithm_checks bash scripts/algorithm_count.sh
#                                              # another build's program (e.g. an older
#                                              # commit's, built from a worktree)
#
# Each algorithm (benches/src/bin/algorithm_checks.rs: 10,000 keys round-robin, a fake clock,
# every check allowed) runs twice under cachegrind, with 200,000 and 600,000 checks;
# instructions per check are the difference over the 400,000 checks in between, so
# start-up and the keys' first checks are not counted. Instructions are not time: a cache
# miss or a division costs more than an add. Installs valgrind (Debian package) if it is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/valgrind.sh

bin="${ALGORITHM_CHECKS:-}"
if [ -z "$bin" ]; then
  cargo build -q -p tollgate-bench --release --bin algorithm_checks
  bin="${CARGO_TARGET_DIR:-target}/release/algorithm_checks"
fi

declare -A per
algorithms=(gcra fixed-window fixed-window-random sliding-window sliding-log-100)
for algorithm in "${algorithms[@]}"; do
  low=$(instructions "$algorithm" 200000)
  high=$(instructions "$algorithm" 600000)
  per[$algorithm]=$(( (high - low) / 400000 ))
done

printf '%-22s %12s %8s\n' algorithm instr/check "÷ gcra"
for algorithm in "${algorithms[@]}"; do
  printf '%-22s %12s %8s\n' "$algorithm" "${per[$algorithm]}" \
    "$(awk -v a="${per[$algorithm]}" -v b="${per[gcra]}" 'BEGIN { printf "%.2f", a / b }')"
done
