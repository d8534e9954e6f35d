#!/usr/bin/env bash
# Where an allowed and a refused request's instructions go inside tollgate: valgrind's
# callgrind over the middleware benchmark's routers, inclusive instructions per request of
# each tollgate function (and of the allocator and memcpy, all callers together).
#
#   bash scripts/middleware_profile.sh [config ...]
#
# Default configs: bare and noop_layer (their whole request only, the baselines), tollgate
# (allowed) and tollgate_denied.
#
# As scripts/middleware_count.sh: each config (benches/src/bin/middleware_requests.rs) runs
# with 20,000 and 60,000 requests, and a figure is the difference over the 40,000 in
# between, so start-up is not counted. Inclusive: a function's figure holds its callees'
# (render is inside finish, finish inside proceed, proceed inside call). Installs valgrind
# (Debian package) if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/middleware_requests.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

configs=("$@")
if [ ${#configs[@]} -eq 0 ]; then configs=(bare noop_layer tollgate tollgate_denied); fi
for config in "${configs[@]}"; do
  for n in 20000 60000; do
    valgrind --tool=callgrind --callgrind-out-file="$work/$config.$n" "$bin" "$config" "$n" \
      >/dev/null 2>&1 || { echo "$config: the run failed" >&2; exit 1; }
    callgrind_annotate --inclusive=yes --threshold=100 "$work/$config.$n" >"$work/$config.$n.txt"
  done
  python3 - "$config" "$work/$config.20000.txt" "$work/$config.60000.txt" <<'PY'
import re, sys

def load(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\S.*?)(?: \[[^\]]*\])?$", line)
        if m:
            out[m.group(2)] = out.get(m.group(2), 0) + int(m.group(1).replace(",", ""))
    return out

config, low, high = sys.argv[1], load(sys.argv[2]), load(sys.argv[3])
total = next((high[k] - low.get(k, 0) for k in high if k.startswith("PROGRAM TOTALS")), None)
rows = []
for name, count in high.items():
    per = (count - low.get(name, 0)) / 40000
    short = name.split(":", 1)[1] if name.startswith("???:") else name
    mine = "tollgate::" in short and "tollgate_bench" not in short
    alloc = re.search(r"malloc\.c:(malloc|free)$|__memcpy_", short)
    if per >= 50 and (mine or alloc):
        rows.append((per, short))
print(f"\n{config}: inclusive instructions per request")
if total:
    print(f"{total / 40000:8.0f}  the whole request (router, handler, runtime)")
for per, name in sorted(rows, reverse=True):
    name = re.sub(r"^core::ptr::drop_in_place<(.*)>$", r"drop of \1", name)
    while True:  # generic parameters off, innermost first: RateLimit<S,St,R> -> RateLimit
        shorter = re.sub(r"(\w)<[^<>]*>", r"\1", name)
        if shorter == name:
            break
        name = shorter
    name = re.sub(r"^<(\S+) as [^<>]+>", r"\1", name)  # <A as Trait>::f -> A::f
    name = re.sub(r"^\S*malloc\.c:(\w+)$", r"\1 (libc, every caller)", name)
    name = re.sub(r"^\S*__memcpy_\S*$", "memcpy (libc, every caller)", name)
    print(f"{per:8.0f}  {name}")
PY
done
