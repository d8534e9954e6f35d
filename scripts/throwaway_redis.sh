# Sourced by the comparison scripts: a redis-server on a free loopback port, with no
# persistence, in a temporary folder; shut down and removed when the script exits.
#
#   source scripts/throwaway_redis.sh   # sets $port and $dir, starts the server
#   start_redis                         # starts it again (after a kill), empty
#
# REDIS_CPUS (a taskset CPU list) pins the server, e.g. to a core of its own.

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d)

start_redis() {
  local pin=()
  if [ -n "${REDIS_CPUS:-}" ]; then pin=(taskset -c "$REDIS_CPUS"); fi
  "${pin[@]}" redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
start_redis
